//! The testkit's own servers, tested as any client would meet them: over real HTTP.

mod hooked;
mod idp;
mod llama_build;
mod oauth;

//! The testkit's own servers, tested as any client would meet them: over real HTTP. The
//! checks of the model server's install script are the `llama` target (`tests/llama/`).

mod hooked;
mod idp;
mod oauth;

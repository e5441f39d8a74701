//! DNS resolution behind a trait, so tests can serve hostile answers (V4).

use std::io;
use std::net::IpAddr;

use async_trait::async_trait;

/// Resolves a host name to addresses. The guard asks once per call and connects only to
/// the addresses it vetted from that one answer.
#[async_trait]
pub trait Resolver: Send + Sync + 'static {
    /// Every address the name resolves to. An empty answer is treated as unresolvable.
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// The operating system's resolver (getaddrinfo through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemResolver;

#[async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let addrs = tokio::net::lookup_host((host, 0)).await?;
        let mut ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
        ips.dedup();
        Ok(ips)
    }
}

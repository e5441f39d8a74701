//! Who gets a connection: at most `max_connections` at once in total and at most
//! `max_connections_per_client` from one client address (an IPv6 client by its /64, which
//! one host usually holds whole). One address that opens connections and sends nothing,
//! or sends a body a byte a second, holds its share and no more, so every other client is
//! still served. A connection over its address's share is answered 503 and closed at
//! once, never parked in the backlog where it would wait ahead of other clients.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::net::TcpStream;

/// The connections each client address holds.
#[derive(Debug)]
pub(crate) struct Shares {
    per_client: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection counted against its client's share, until it is dropped.
#[derive(Debug)]
pub(crate) struct Share {
    shares: Arc<Shares>,
    client: IpAddr,
}

impl Shares {
    pub(crate) fn new(per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            per_client: per_client.max(1),
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A share for a connection from `peer`, or `None` when its client holds all of its.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Share> {
        let client = client_of(peer);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(client).or_insert(0);
        if *count >= self.per_client {
            return None;
        }
        *count += 1;
        Some(Share {
            shares: self.clone(),
            client,
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
        }
    }
}

/// The client an address belongs to: an IPv4 address (mapped or not) itself, an IPv6
/// address its /64.
fn client_of(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

/// Answers a connection over its client's share with a 503 in our error shape, as far as
/// the socket takes it without waiting, and closes it. What the client already sent is
/// read first, so the close is a clean one and the client can read the answer.
pub(crate) fn turn_away(stream: TcpStream, plain_http: bool) {
    let mut scratch = [0u8; 4096];
    let _ = stream.try_read(&mut scratch);
    if plain_http {
        let _ = stream.try_write(&busy_answer());
    }
}

fn busy_answer() -> Vec<u8> {
    let body = json!({ "error": {
        "code": "too_many_connections",
        "message": "this client address holds its share of the server's connections: close one, or retry in a few seconds",
    }})
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 5\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_gets_its_share_and_a_freed_connection_is_given_back() {
        let shares = Shares::new(2);
        let attacker: IpAddr = "127.0.0.2".parse().unwrap();
        let first = shares.admit(attacker).unwrap();
        let _second = shares.admit(attacker).unwrap();
        assert!(shares.admit(attacker).is_none());
        assert!(shares.admit("127.0.0.1".parse().unwrap()).is_some());
        drop(first);
        assert!(shares.admit(attacker).is_some());
    }

    #[test]
    fn an_ipv6_client_is_its_slash_64_and_a_mapped_address_is_its_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(client_of(a), client_of(b));
        assert_ne!(client_of(a), client_of("2001:db8:1:3::1".parse().unwrap()));
        assert_eq!(
            client_of("::ffff:10.0.0.1".parse().unwrap()),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
    }
}

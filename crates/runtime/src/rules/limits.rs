//! The rules of limits (R14) as a store applies them inside its one short transaction: a
//! token bucket for rate (R per second, a burst of B) and a concurrency limit (K holders),
//! decided over the state as read and the time, all or nothing over every limit a call is
//! subject to.
//!
//! A bucket's state is what is stored: its tokens and when they were last counted. A
//! bucket never stored is full. Holders are counted by the store from live holds (a hold
//! whose lease ran out no longer counts).

/// One limit as configured, without its name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitRule {
    /// At most this many calls at once; `None`: no concurrency limit.
    pub concurrency: Option<u32>,
    /// Calls started per second on average; `None`: no rate limit.
    pub rate_per_second: Option<f64>,
    /// How many calls may start at once after a quiet spell (the bucket's size).
    pub burst: u32,
}

/// A bucket as stored: its tokens at `refilled_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// Tokens in the bucket at `refilled_ms`.
    pub tokens: f64,
    /// When the tokens were counted (milliseconds since the epoch).
    pub refilled_ms: i64,
}

/// One limit's state as the store read it inside the transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitRead {
    /// The limit's key (`server:tickets`).
    pub key: String,
    /// The rule in force.
    pub rule: LimitRule,
    /// Live holds of the key (not yet expired).
    pub holders: u32,
    /// The stored bucket; `None` for a key never taken (a full bucket).
    pub bucket: Option<Bucket>,
}

/// What the store does with a take.
#[derive(Debug, Clone, PartialEq)]
pub enum TakeDecision {
    /// Take every limit: write these buckets and a hold on every key with a concurrency
    /// limit (`holds`).
    Take {
        /// The buckets to store, by key.
        buckets: Vec<(String, Bucket)>,
        /// The keys to hold.
        holds: Vec<String>,
    },
    /// Take nothing; the first limit that is full, and how long until its bucket has a
    /// token (`None` for a concurrency limit: until a holder lets go).
    Wait {
        /// The key that is full.
        key: String,
        /// For a rate limit, how long until it has a token.
        retry_in_ms: Option<i64>,
    },
}

/// The bucket's tokens at `now_ms`: what it had, plus the rate over the time since, never
/// more than the burst. A bucket never stored, or one stored in the future (a clock moved
/// back), is read as full or as stored, never as more.
pub fn refill(bucket: Option<Bucket>, rate_per_second: f64, burst: u32, now_ms: i64) -> Bucket {
    let full = f64::from(burst);
    let Some(bucket) = bucket else {
        return Bucket {
            tokens: full,
            refilled_ms: now_ms,
        };
    };
    let elapsed_ms = (now_ms - bucket.refilled_ms).max(0);
    // Milliseconds fit an f64 exactly for any real span.
    let tokens = (bucket.tokens + rate_per_second * elapsed_ms as f64 / 1000.0).min(full);
    Bucket {
        tokens,
        refilled_ms: now_ms.max(bucket.refilled_ms),
    }
}

/// One token out of the bucket, or how long until there is one.
pub fn take_token(
    bucket: Option<Bucket>,
    rate_per_second: f64,
    burst: u32,
    now_ms: i64,
) -> Result<Bucket, i64> {
    let now = refill(bucket, rate_per_second, burst, now_ms);
    if now.tokens >= 1.0 {
        return Ok(Bucket {
            tokens: now.tokens - 1.0,
            ..now
        });
    }
    let missing = 1.0 - now.tokens;
    // At least one millisecond, so a waiter never spins.
    Err(((missing / rate_per_second * 1000.0).ceil() as i64).max(1))
}

/// True when a concurrency limit has room for one more holder.
pub fn has_room(rule: &LimitRule, holders: u32) -> bool {
    rule.concurrency.is_none_or(|k| holders < k)
}

/// The take of every limit a call is subject to, all or nothing: the call takes a token
/// of every bucket and a slot of every concurrency limit, or nothing at all (so a call
/// never holds one limit while it waits for another, and two calls cannot deadlock).
/// `reads` are in the one fixed order of keys the store locked them in.
pub fn decide(reads: &[LimitRead], now_ms: i64) -> TakeDecision {
    let mut buckets = Vec::new();
    let mut holds = Vec::new();
    for read in reads {
        if !has_room(&read.rule, read.holders) {
            return TakeDecision::Wait {
                key: read.key.clone(),
                retry_in_ms: None,
            };
        }
        if let Some(rate) = read.rule.rate_per_second {
            match take_token(read.bucket, rate, read.rule.burst, now_ms) {
                Ok(bucket) => buckets.push((read.key.clone(), bucket)),
                Err(retry_in_ms) => {
                    return TakeDecision::Wait {
                        key: read.key.clone(),
                        retry_in_ms: Some(retry_in_ms),
                    };
                }
            }
        }
        if read.rule.concurrency.is_some() {
            holds.push(read.key.clone());
        }
    }
    TakeDecision::Take { buckets, holds }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(r: f64, burst: u32) -> LimitRule {
        LimitRule {
            concurrency: None,
            rate_per_second: Some(r),
            burst,
        }
    }

    fn slots(k: u32) -> LimitRule {
        LimitRule {
            concurrency: Some(k),
            rate_per_second: None,
            burst: 1,
        }
    }

    fn read(key: &str, rule: LimitRule, holders: u32, bucket: Option<Bucket>) -> LimitRead {
        LimitRead {
            key: key.into(),
            rule,
            holders,
            bucket,
        }
    }

    #[test]
    fn a_bucket_never_taken_is_full_and_gives_its_burst_at_once() {
        let mut bucket = None;
        for _ in 0..5 {
            bucket = Some(take_token(bucket, 1.0, 5, 1_000).expect("a token"));
        }
        assert_eq!(take_token(bucket, 1.0, 5, 1_000), Err(1_000));
    }

    #[test]
    fn an_empty_bucket_says_how_long_until_its_next_token() {
        let empty = Some(Bucket {
            tokens: 0.0,
            refilled_ms: 0,
        });
        assert_eq!(take_token(empty, 10.0, 10, 0), Err(100));
        assert_eq!(take_token(empty, 10.0, 10, 40), Err(60));
        assert!(take_token(empty, 10.0, 10, 100).is_ok());
        // A fraction of a millisecond still waits one.
        assert_eq!(take_token(empty, 1e9, 1, 0), Err(1));
    }

    #[test]
    fn a_bucket_refills_at_its_rate_and_never_past_its_burst() {
        let half = Some(Bucket {
            tokens: 0.5,
            refilled_ms: 0,
        });
        assert_eq!(refill(half, 2.0, 3, 500).tokens, 1.5);
        assert_eq!(refill(half, 2.0, 3, 60_000).tokens, 3.0);
    }

    #[test]
    fn a_clock_that_moved_back_adds_no_tokens() {
        let stored = Some(Bucket {
            tokens: 0.25,
            refilled_ms: 10_000,
        });
        let now = refill(stored, 100.0, 10, 5_000);
        assert_eq!(now.tokens, 0.25);
        assert_eq!(now.refilled_ms, 10_000);
    }

    #[test]
    fn over_a_minute_a_bucket_gives_its_rate_and_its_burst_no_more() {
        // Asking every millisecond for 60 s at 5 per second with a burst of 2.
        let mut bucket = None;
        let mut taken = 0;
        for now in 0..60_000 {
            if let Ok(b) = take_token(bucket, 5.0, 2, now) {
                bucket = Some(b);
                taken += 1;
            }
        }
        assert!((300..=302).contains(&taken), "took {taken}");
    }

    #[test]
    fn a_concurrency_limit_has_room_below_its_holders() {
        assert!(has_room(&slots(2), 1));
        assert!(!has_room(&slots(2), 2));
        assert!(has_room(&rate(1.0, 1), 1_000));
    }

    #[test]
    fn every_limit_is_taken_or_none() {
        let reads = [
            read("server:a", slots(2), 1, None),
            read("tool:a__t", rate(1.0, 1), 0, None),
        ];
        assert_eq!(
            decide(&reads, 7),
            TakeDecision::Take {
                buckets: vec![(
                    "tool:a__t".into(),
                    Bucket {
                        tokens: 0.0,
                        refilled_ms: 7
                    }
                )],
                holds: vec!["server:a".into()],
            }
        );
        let full = [
            read("agent:x", rate(1.0, 1), 0, None),
            read("server:a", slots(2), 2, None),
        ];
        assert_eq!(
            decide(&full, 7),
            TakeDecision::Wait {
                key: "server:a".into(),
                retry_in_ms: None
            },
            "the agent's token is not spent when the server is full"
        );
    }

    #[test]
    fn a_rate_that_is_spent_names_its_key_and_the_wait() {
        let spent = Some(Bucket {
            tokens: 0.0,
            refilled_ms: 0,
        });
        let reads = [read("model:m", rate(4.0, 1), 0, spent)];
        assert_eq!(
            decide(&reads, 0),
            TakeDecision::Wait {
                key: "model:m".into(),
                retry_in_ms: Some(250)
            }
        );
    }

    #[test]
    fn a_call_under_no_limit_takes_nothing() {
        assert_eq!(
            decide(&[], 0),
            TakeDecision::Take {
                buckets: vec![],
                holds: vec![]
            }
        );
    }
}

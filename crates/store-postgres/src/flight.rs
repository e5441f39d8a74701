//! Transactions whose statements reach the server in flights. tokio-postgres sends a
//! request when its future is first polled and pipelines the requests polled together,
//! so BEGIN and a transaction's first statement, or its last statement and COMMIT, cost
//! one round trip instead of two. A statement that fails aborts the transaction: the
//! COMMIT sent behind it rolls back, and the statement's error is the answer.
//!
//! While such a transaction may be open, the connection is marked (`Conn::set_open`):
//! a call dropped halfway (a caller's timeout) takes its connection out of the pool, so
//! no later call runs inside the transaction it left.

use std::future::Future;

use crate::connection::Conn;
use crate::failure::Failure;

/// Sends BEGIN and `first` in one flight. `first` must send its statement when first
/// polled (a tokio-postgres call on a prepared statement does). On an error the
/// transaction is rolled back.
pub(crate) async fn begin_with<T>(
    conn: &Conn,
    first: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    conn.set_open(true);
    // Biased: polled in the order written, so BEGIN is sent first.
    let (begun, answer) = tokio::join!(biased; conn.batch_execute("BEGIN"), first);
    match begun.map_err(Failure::from).and(answer) {
        Ok(answer) => Ok(answer),
        Err(error) => {
            rollback(conn).await;
            Err(error)
        }
    }
}

/// Sends `last` and COMMIT in one flight: the answer is `last`'s once the COMMIT is
/// confirmed, or `last`'s error (the COMMIT then rolled back). A COMMIT that fails leaves
/// the connection marked, so it leaves the pool.
pub(crate) async fn commit_with<T>(
    conn: &Conn,
    last: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    let (answer, committed) = tokio::join!(biased; last, conn.batch_execute("COMMIT"));
    let ended = committed.is_ok();
    if ended {
        conn.set_open(false);
    }
    let answer = answer?;
    committed?;
    Ok(answer)
}

/// Rolls the transaction back and waits for it. The caller's error is the one worth
/// reporting; a failed rollback leaves the connection marked, so it leaves the pool.
pub(crate) async fn rollback(conn: &Conn) {
    if conn.batch_execute("ROLLBACK").await.is_ok() {
        conn.set_open(false);
    }
}

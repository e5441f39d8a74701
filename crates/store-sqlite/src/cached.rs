//! Statements run from the connection's statement cache. rusqlite's `execute` and
//! `query_row` parse their SQL on every call; on the run path, where every step runs the
//! same dozen statements, the parsing was a tenth of a worker's CPU.

use rusqlite::{Connection, Params, Row};

/// `execute` and `query_row` through `prepare_cached`, with the same results and errors.
pub(crate) trait Cached {
    /// [`Connection::execute`], its statement kept for the next call.
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;

    /// [`Connection::query_row`], its statement kept for the next call.
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

#[cfg(test)]
mod tests {
    use super::Cached;
    use rusqlite::Connection;

    #[test]
    fn cached_statements_answer_as_the_plain_ones_do() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)")
            .unwrap();
        for round in 0..3 {
            let changed = conn
                .execute_cached(
                    "INSERT OR REPLACE INTO t (k, v) VALUES (?1, ?2)",
                    ("a", round),
                )
                .unwrap();
            assert_eq!(changed, 1);
            let v: i64 = conn
                .query_row_cached("SELECT v FROM t WHERE k = ?1", ["a"], |r| r.get(0))
                .unwrap();
            assert_eq!(v, round);
        }
        let missing = conn.query_row_cached("SELECT v FROM t WHERE k = ?1", ["b"], |r| {
            r.get::<_, i64>(0)
        });
        assert!(matches!(missing, Err(rusqlite::Error::QueryReturnedNoRows)));
        let broken = conn.execute_cached("INSERT INTO nowhere VALUES (1)", []);
        assert!(broken.is_err(), "a bad statement fails as with execute");
    }
}

//! For tests: the plan SQLite makes for a statement, to check which index it reads.

use rusqlite::{Connection, Params};

/// The `detail` column of `EXPLAIN QUERY PLAN sql` with `params`, its rows joined by "; ".
pub(crate) fn query_plan(conn: &Connection, sql: &str, params: impl Params) -> String {
    let plan: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(params, |row| row.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    plan.join("; ")
}

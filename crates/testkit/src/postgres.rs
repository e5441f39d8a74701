//! [`TempCluster`]: a real PostgreSQL server for tests, in a temporary directory on a free
//! 127.0.0.1 port, stopped and removed on drop; or, when `RUNWARDEN_TEST_PG_URL` names a
//! running server (started once by `scripts/pg-test-cluster.sh` for a whole test run), that
//! server. Either way [`TempCluster::fresh_database`] answers the URL of a new, empty
//! database, so tests never share data.
//!
//! Missing PostgreSQL binaries are a panic that says how to install them: these tests are
//! never skipped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming a running server (a superuser URL) to create test
/// databases on instead of starting a cluster per test process.
pub(crate) const SHARED_URL_ENV: &str = "RUNWARDEN_TEST_PG_URL";

/// The superuser every cluster started here is created with (trust authentication).
pub(crate) const SUPERUSER: &str = "runwarden";

/// A real PostgreSQL server for tests: a temporary cluster on a free 127.0.0.1 port,
/// stopped and removed on drop, or the running server `RUNWARDEN_TEST_PG_URL` names.
/// [`TempCluster::fresh_database`] answers the URL of a new, empty database, so tests
/// never share data. Missing PostgreSQL binaries are a panic that says how to install them.
#[derive(Debug)]
pub struct TempCluster {
    /// `postgres://runwarden@127.0.0.1:PORT` (no database): the server's base URL.
    base: String,
    /// The cluster this value started, if any (none when the shared server is used).
    owned: Option<Owned>,
}

#[derive(Debug)]
struct Owned {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    running: bool,
    /// Whether the server syncs its WAL to disk at commit (a real server does); off for
    /// tests, whose data is thrown away.
    fsync: bool,
}

static DATABASES: AtomicU64 = AtomicU64::new(0);

impl TempCluster {
    /// The shared server when `RUNWARDEN_TEST_PG_URL` is set, else a cluster of this test's
    /// own ([`TempCluster::start_owned`]).
    pub fn start() -> Self {
        match std::env::var(SHARED_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Self {
                base: url.trim().trim_end_matches('/').to_owned(),
                owned: None,
            },
            _ => Self::start_owned(),
        }
    }

    /// Always a cluster of this test's own: `initdb` into a temporary directory, then
    /// `pg_ctl start -w` on a free 127.0.0.1 port with the socket in that directory. Tests
    /// that stop or restart the server use this one.
    pub fn start_owned() -> Self {
        Self::start_owned_with(false)
    }

    /// [`start_owned`](Self::start_owned) with `fsync=on`, as a real server runs: each
    /// commit waits for the disk. For benches that compare stores with their syncs.
    pub fn start_owned_synced() -> Self {
        Self::start_owned_with(true)
    }

    fn start_owned_with(fsync: bool) -> Self {
        let bin = binaries();
        let dir = tempfile::Builder::new()
            .prefix("runwarden-pg-")
            .tempdir()
            .expect("creating a temporary directory for the PostgreSQL cluster");
        if is_root() {
            // initdb refuses to run as root: the cluster belongs to the postgres user.
            run(Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir.path()));
        }
        let data = dir.path().join("data");
        run(as_cluster_owner(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["--auth=trust", "-U", SUPERUSER, "-E", "UTF8", "--no-sync"]));
        let mut owned = Owned {
            dir,
            bin,
            port: free_port(),
            running: false,
            fsync,
        };
        owned.pg_ctl_start();
        Self {
            base: format!("postgres://{SUPERUSER}@127.0.0.1:{}", owned.port),
            owned: Some(owned),
        }
    }

    /// Creates a database with a unique name and answers its URL.
    pub async fn fresh_database(&self) -> String {
        let n = DATABASES.fetch_add(1, Ordering::Relaxed);
        let name = format!("rw_test_{}_{n}", std::process::id());
        let admin = format!("{}/postgres", self.base);
        let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting to the test server at {admin}: {e}"));
        let driver = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("creating database {name}: {e}"));
        drop(client);
        let _ = driver.await;
        format!("{}/{name}", self.base)
    }

    /// The URL of a database on this server that does not exist yet (for error tests).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Stops this test's own cluster at once (`pg_ctl stop -m immediate`), as a crash
    /// would. Panics for the shared server, which other tests use.
    pub fn stop(&mut self) {
        let owned = self
            .owned
            .as_mut()
            .expect("only a cluster started by this test (start_owned) can be stopped");
        owned.pg_ctl_stop();
    }

    /// Starts this test's own cluster again on the same port after [`stop`](Self::stop).
    pub fn restart(&mut self) {
        let owned = self
            .owned
            .as_mut()
            .expect("only a cluster started by this test (start_owned) can be restarted");
        owned.pg_ctl_start();
    }
}

impl Owned {
    fn pg_ctl_start(&mut self) {
        let data = self.dir.path().join("data");
        let log = self.dir.path().join("server.log");
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync={} -c max_connections=200",
            self.port,
            self.dir.path().display(),
            if self.fsync { "on" } else { "off" },
        );
        // Statement counts for the benches that read what a run costs the server, where
        // the server's installation has the module.
        let statements = self
            .bin
            .parent()
            .map(|p| p.join("lib/pg_stat_statements.so"));
        if statements.is_some_and(|lib| lib.exists()) {
            options.push_str(" -c shared_preload_libraries=pg_stat_statements");
        }
        let output = as_cluster_owner(&self.bin.join("pg_ctl"))
            .arg("start")
            .arg("-w")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .arg("-o")
            .arg(options)
            .output()
            .expect("running pg_ctl start");
        if !output.status.success() {
            let server_log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!(
                "pg_ctl start failed: {}\n{server_log}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        self.running = true;
    }

    fn pg_ctl_stop(&mut self) {
        if !self.running {
            return;
        }
        let data = self.dir.path().join("data");
        let _ = as_cluster_owner(&self.bin.join("pg_ctl"))
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(&data)
            .output();
        self.running = false;
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // The temporary directory (data, socket, log) is removed after this.
        self.pg_ctl_stop();
    }
}

/// The directory holding `initdb` and `pg_ctl`: from PATH, else the newest
/// /usr/lib/postgresql/*/bin.
fn binaries() -> PathBuf {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                return std::fs::canonicalize(dir.join("initdb"))
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
                    .unwrap_or(dir);
            }
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "PostgreSQL's initdb and pg_ctl were not found on PATH or in /usr/lib/postgresql/*/bin: \
             install them with `apt-get install postgresql-15` (these tests are never skipped)"
        )
    })
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A command for a PostgreSQL binary, run as the `postgres` user when this process is
/// root (initdb and postgres refuse to run as root).
fn as_cluster_owner(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=postgres", "--regid=postgres", "--clear-groups"])
            .arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A port nothing listens on right now (the kernel's pick, released for the server).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free loopback port");
    listener.local_addr().expect("a bound address").port()
}

//! The clients behind PgBouncer in transaction mode (#48 item 1): the
//! application's own queries share the server connection with the clients'
//! calls and must see their own settings. PgBouncer from Debian's package
//! (`make setup` installs it), run as the cluster's OS user.

use pg_ticket_integration::{owned_dir, Cluster};
use postgres::{Client, NoTls};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use ticket_client::{BlockPool, GeneratorConfig, LeasedGenerator, PoolConfig};

struct Bouncer {
    dir: std::path::PathBuf,
    port: u16,
}

impl Bouncer {
    /// PgBouncer on 127.0.0.1:`port` in front of `cluster`'s database
    /// `postgres`, transaction pooling, one server connection.
    fn start(cluster: &Cluster, port: u16) -> Bouncer {
        let dir = cluster.dir.join("pgbouncer");
        owned_dir(&dir);
        let ini = format!(
            "[databases]\n\
             postgres = host={} port={} dbname=postgres\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/userlist.txt\n\
             pool_mode = transaction\n\
             default_pool_size = 1\n\
             max_client_conn = 50\n\
             server_reset_query =\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            cluster.dir.display(),
            cluster.port,
            dir = dir.display()
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
        let ini_path = dir.join("pgbouncer.ini");
        let status = as_cluster_user("pgbouncer", &["-d", ini_path.to_str().unwrap()]);
        assert!(status.success(), "pgbouncer did not start (make setup installs it); see {}/pgbouncer.log", dir.display());
        let bouncer = Bouncer { dir, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Client::connect(&bouncer.dsn(), NoTls).is_err() {
            assert!(Instant::now() < deadline, "pgbouncer does not answer on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        bouncer
    }

    fn dsn(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pgbouncer.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
    }
}

fn as_cluster_user(program: &str, args: &[&str]) -> std::process::ExitStatus {
    let which = ["/usr/sbin", "/usr/bin"].iter().map(|d| Path::new(d).join(program)).find(|p| p.exists());
    let program = which.unwrap_or_else(|| panic!("{program} is not installed (make setup installs it)"));
    if unsafe { libc::geteuid() } == 0 {
        Command::new("runuser").args(["-u", "postgres", "--"]).arg(&program).args(args).status()
    } else {
        Command::new(&program).args(args).status()
    }
    .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

/// What a session of the application sees of the settings the clients
/// pinned (0.4.0 left them in the server connection PgBouncer shares).
fn settings(app: &mut Client) -> Vec<(String, String)> {
    ["search_path", "statement_timeout", "lock_timeout", "client_min_messages", "client_connection_check_interval"]
        .iter()
        .map(|name| (name.to_string(), app.query_one(&format!("SHOW {name}"), &[]).unwrap().get::<_, String>(0)))
        .collect()
}

/// #48 item 1: a leased generator and a block pool given the application's
/// pooled connection string, and the application's own queries through
/// the same single server connection: the application sees its own
/// settings (0.4.0: `search_path = pg_catalog, pg_temp`, a 20 s statement
/// timeout and `client_min_messages = warning` left behind), and its own
/// table by its unqualified name.
#[test]
fn the_clients_leave_nothing_in_a_server_connection_pgbouncer_shares() {
    let c = Cluster::start("pgbouncer", 55648, &[]);
    c.connect().batch_execute("CREATE TABLE public.billing_order (id bigint PRIMARY KEY)").unwrap();
    let bouncer = Bouncer::start(&c, 55649);
    let mut app = Client::connect(&bouncer.dsn(), NoTls).unwrap();
    let before = settings(&mut app);
    let generator = LeasedGenerator::start(GeneratorConfig::new(bouncer.dsn(), "behind-pgbouncer")).unwrap();
    generator.wait_for_lease(Duration::from_secs(30)).expect("a lease through PgBouncer");
    let mut pool_config = PoolConfig::new(bouncer.dsn(), "orders", 100);
    pool_config.wait_timeout = Duration::from_secs(10);
    let pool = BlockPool::start(pool_config).unwrap();
    for _ in 0..250 {
        let id = pool.next_id().expect("an ID from a block reserved through PgBouncer");
        app.execute("INSERT INTO billing_order VALUES ($1)", &[&id]).expect("the application's table by its own search_path");
        generator.next_id().expect("a snowflake under a lease through PgBouncer");
    }
    assert_eq!(settings(&mut app), before, "the application's settings after the clients' calls");
    drop(pool);
    drop(generator);
    assert_eq!(settings(&mut app), before, "and after their releases");
    let rows: i64 = app.query_one("SELECT count(*) FROM billing_order", &[]).unwrap().get(0);
    assert_eq!(rows, 250);
    drop(app);
    drop(bouncer);
    c.stop();
}

//! The throwaway PostgreSQL cluster of `testing::postgres`: it starts with the settings it
//! promises, serves isolated databases, and leaves nothing behind (no listening server, no
//! directory) once dropped; it can be stopped and started again on the same port and data. Skipped, with one line saying so, where PostgreSQL is not installed
//! (a failure under `CI=true`).
#![cfg(feature = "testing-postgres")]

use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use durable_sessions::testing::postgres::{start_or_skip, CreateDatabaseError, ShutdownMode};
use postgres::{Client, NoTls};

fn setting(client: &mut Client, name: &str) -> String {
    client
        .query_one(&format!("SHOW {name}"), &[])
        .unwrap()
        .get(0)
}

#[test]
fn a_cluster_serves_isolated_databases_and_is_gone_after_drop() {
    let Some(pg) = start_or_skip("a_cluster_serves_isolated_databases_and_is_gone_after_drop")
    else {
        return;
    };
    let (port, dir) = (pg.port(), pg.dir().to_path_buf());
    assert!(dir.join("data").join("PG_VERSION").is_file());
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    );

    let url_a = pg.create_database("harness_a").unwrap();
    let url_b = pg.create_database("harness_b").unwrap();
    assert_eq!(
        url_a,
        format!("postgres://postgres@127.0.0.1:{port}/harness_a")
    );
    let mut a = Client::connect(&url_a, NoTls).unwrap();
    let mut b = Client::connect(&url_b, NoTls).unwrap();

    let row = a
        .query_one("SELECT 1 + $1::int4, current_database()", &[&41])
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_eq!(row.get::<_, String>(1), "harness_a");

    // Each database is its own namespace.
    a.batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (7)")
        .unwrap();
    let x: i32 = a.query_one("SELECT x FROM t", &[]).unwrap().get(0);
    assert_eq!(x, 7);
    assert!(
        b.query("SELECT x FROM t", &[]).is_err(),
        "t leaked into harness_b"
    );

    // The promised configuration: stock durability, loopback only, room for three nodes.
    assert_eq!(setting(&mut a, "fsync"), "on");
    assert_eq!(setting(&mut a, "synchronous_commit"), "on");
    assert_eq!(setting(&mut a, "listen_addresses"), "127.0.0.1");
    assert_eq!(setting(&mut a, "max_connections"), "300");
    assert_eq!(setting(&mut a, "server_encoding"), "UTF8");
    let is_superuser: bool = a
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(is_superuser);
    drop((a, b));

    let started = Instant::now();
    drop(pg);
    eprintln!("cluster stopped in {:?}", started.elapsed());
    assert!(
        TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(1))
            .is_err(),
        "port {port} still accepts connections after drop"
    );
    assert!(!dir.exists(), "{} still exists after drop", dir.display());
}

#[test]
fn create_database_refuses_bad_names_and_duplicates() {
    let Some(pg) = start_or_skip("create_database_refuses_bad_names_and_duplicates") else {
        return;
    };
    for bad in ["", "Upper", "1st", "a-b", "a;drop", &"x".repeat(64)] {
        assert!(
            matches!(
                pg.create_database(bad),
                Err(CreateDatabaseError::InvalidName(_))
            ),
            "{bad:?} accepted"
        );
    }
    pg.create_database("twice").unwrap();
    assert!(matches!(
        pg.create_database("twice"),
        Err(CreateDatabaseError::Postgres { .. })
    ));
}

#[actix_rt::test]
async fn a_cluster_can_be_started_and_used_from_an_async_test() {
    // The sync client panics inside a tokio runtime; the harness keeps its own connections off
    // the test's thread.
    let Some(pg) = start_or_skip("a_cluster_can_be_started_and_used_from_an_async_test") else {
        return;
    };
    let url = pg.create_database("from_async").unwrap();
    let count = std::thread::spawn(move || {
        let mut client = Client::connect(&url, NoTls).unwrap();
        client
            .query_one(
                "SELECT count(*) FROM pg_database WHERE datname = 'from_async'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
    })
    .join()
    .unwrap();
    assert_eq!(count, 1);
}

#[test]
fn two_clusters_run_side_by_side() {
    let Some(first) = start_or_skip("two_clusters_run_side_by_side") else {
        return;
    };
    let Some(second) = start_or_skip("two_clusters_run_side_by_side") else {
        return;
    };
    assert_ne!(first.port(), second.port());
    assert_ne!(first.dir(), second.dir());
    let second_port = second.port();
    drop(first);
    // Dropping one leaves the other serving.
    let mut client = Client::connect(&second.url(), NoTls).unwrap();
    client.batch_execute("SELECT 1").unwrap();
    drop(client);
    drop(second);
    assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, second_port)).is_err());
}

/// Stopped (every connection broken, the port closed) and started again, the cluster serves the
/// same URL with everything committed before: for a fast restart and for an immediate stop
/// (crash recovery at the next start).
#[test]
fn a_stopped_cluster_starts_again_on_its_port_with_its_data() {
    let Some(mut pg) = start_or_skip("a_stopped_cluster_starts_again_on_its_port_with_its_data")
    else {
        return;
    };
    let port = pg.port();
    let url = pg.create_database("harness_restart").unwrap();
    let mut client = Client::connect(&url, NoTls).unwrap();
    client
        .batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        .unwrap();

    let away = pg.restart(ShutdownMode::Fast).unwrap();
    eprintln!("fast restart: away {away:?}");
    assert!(pg.is_running());
    assert_eq!(pg.port(), port);
    assert!(
        client.query_one("SELECT 1", &[]).is_err(),
        "a connection survived the restart"
    );
    let mut client = Client::connect(&url, NoTls).unwrap();
    client.batch_execute("INSERT INTO t VALUES (2)").unwrap();

    pg.stop_server(ShutdownMode::Immediate).unwrap();
    assert!(!pg.is_running());
    assert!(
        Client::connect(&url, NoTls).is_err(),
        "connected while stopped"
    );
    assert!(
        TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(1))
            .is_err(),
        "port {port} still accepts connections while stopped"
    );
    pg.start_server().unwrap();
    let mut client = Client::connect(&url, NoTls).unwrap();
    let sum: i64 = client
        .query_one("SELECT sum(x) FROM t", &[])
        .unwrap()
        .get(0);
    assert_eq!(sum, 3, "a committed row was lost across the restarts");
}

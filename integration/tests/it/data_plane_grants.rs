//! Attacks on a store's data port, replayed against real
//! processes (one master, one store, loopback). Before grants, a request
//! with segment tag 0 skipped every check: a blind read returned every
//! stored value, and an overwrite with a recomputed CRC32C was served back
//! by `crescentctl get` as good. Now every read and write must carry a
//! capability the master signed with the segment's key for that range,
//! that operation and that time; each probe below is refused with
//! FORBIDDEN and changes nothing.
//!
//! Needs `cargo build --bins` first (`make test` does it).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crescent_integration::LocalCluster;
use crescent_store::protocol::{Grant, Status};
use crescent_store::{TcpTransport, TransferError};

use crate::common::{connect_client, metric_at, one_replica, value};

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn assert_forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, TransferError>) {
    assert!(
        matches!(
            r,
            Err(TransferError::Refused {
                status: Status::Forbidden,
                ..
            })
        ),
        "{what}: {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_serves_only_what_the_master_granted() {
    // Read grants last a 1 s lease, and the store allows no clock skew, so
    // expiry shows within the test.
    let mut cluster = LocalCluster::start(1, &["--lease-ttl".into(), "1s".into()]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    cluster
        .start_store("64mb", &["--grant-clock-skew".into(), "0s".into()])
        .unwrap();
    cluster
        .wait_for_segments(1, Duration::from_secs(15))
        .await
        .unwrap();
    let store_http = cluster.stores[0].http.clone();
    let c = connect_client(&cluster).await;
    let (secret, neighbour) = (value(1), value(2));
    c.put("secret", &secret, &one_replica()).await.unwrap();
    c.put("neighbour", &neighbour, &one_replica())
        .await
        .unwrap();

    let desc = c.master().get_replica_list("secret").await.unwrap();
    let r = desc.replicas[0].clone();
    let other = c
        .master()
        .get_replica_list("neighbour")
        .await
        .unwrap()
        .replicas[0]
        .clone();
    let granted = Grant::from(&r);
    assert_eq!(granted.mac.len(), 16);
    assert!(
        granted.expiry_ms > unix_ms(),
        "a lookup grants a live capability"
    );
    let tcp = TcpTransport::new();
    let mut buf = vec![0u8; secret.len()];

    // The grant as given reads the object.
    tcp.read(&r.endpoint, &mut [(granted, r.offset, &mut buf[..])])
        .await
        .unwrap();
    assert_eq!(buf, secret);
    let before = metric_at(&store_http, "store_transfer_forbidden_total").await;

    // Blind read from the start of the segment, with no grant ("tag 0").
    let blind = tcp
        .read(
            &r.endpoint,
            &mut [(
                Grant {
                    segment_id: r.segment_id,
                    ..Default::default()
                },
                0,
                &mut buf[..],
            )],
        )
        .await;
    assert_forbidden("a blind read", blind);
    // A made-up MAC.
    let forged = Grant {
        mac: [0x5A; 16],
        ..granted
    };
    let r1 = tcp
        .read(&r.endpoint, &mut [(forged, r.offset, &mut buf[..])])
        .await;
    assert_forbidden("a forged MAC", r1);
    // The real MAC on a widened range: the whole segment.
    let widened = Grant {
        offset: 0,
        len: 64 << 20,
        ..granted
    };
    let r2 = tcp
        .read(&r.endpoint, &mut [(widened, 0, &mut buf[..])])
        .await;
    assert_forbidden("a widened grant", r2);
    // One object's grant aimed at its neighbour's bytes.
    let r3 = tcp
        .read(&r.endpoint, &mut [(granted, other.offset, &mut buf[..])])
        .await;
    assert_forbidden("another object's range", r3);
    // An overwrite with the read grant (a CRC recomputed by the attacker
    // would have made it look good before).
    let junk = vec![0xEEu8; secret.len()];
    let w = tcp
        .write(&r.endpoint, &[(granted, r.offset, &junk[..])])
        .await;
    assert_forbidden("a write under a read grant", w);
    // A lease-long grant, once its lease is over.
    while unix_ms() <= granted.expiry_ms + 100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r4 = tcp
        .read(&r.endpoint, &mut [(granted, r.offset, &mut buf[..])])
        .await;
    assert_forbidden("an expired grant", r4);

    assert_eq!(
        metric_at(&store_http, "store_transfer_forbidden_total").await - before,
        6.0
    );
    // Nothing changed: both objects read back as they were put.
    assert_eq!(c.get("secret").await.unwrap(), secret);
    assert_eq!(c.get("neighbour").await.unwrap(), neighbour);
}

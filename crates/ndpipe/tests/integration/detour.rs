//! Uploads around a dead or hung node: three PipeStores with two copies of every photo and a
//! lease long enough that placement still names the node. With one node SIGSTOPped, every
//! upload through the other two succeeds with two copies, none on the stopped node, and none
//! waits past the copy deadline (a hang guard well below the peer deadline, which is what an
//! upload waited before); the same with the node killed; after its restart, rebalancing moves
//! photos placed around it back onto it. And leases that ran out only because they could not
//! be renewed (the Tuner stopped) do not stop uploads: the nodes that answer still count.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{Instance, TunerProcess, on_postgres, sha256};
use crate::replication::{POLL, POLLS, copies, replicated_node, upload};

const NAMES: [&str; 3] = ["dt-a", "dt-b", "dt-c"];
/// The copy deadline the nodes get.
const COPY_TIMEOUT_MS: &str = "2000";
/// A hang guard: the copy deadline and a wide margin, but well below the peer deadline
/// (30 s), which an upload to a hung node waited before.
const GUARD: Duration = Duration::from_secs(15);

#[test]
fn uploads_route_around_a_stopped_or_killed_node() {
    on_postgres("detour", |url| async move { detour_on(&url).await });
}

/// Uploads `count` photos from `seed` on, through the two healthy doors in turn; each must
/// succeed within [`GUARD`] with two copies, none on `away`.
async fn upload_around(
    doors: [&Instance; 2],
    away: &str,
    seeds: std::ops::Range<u32>,
    acked: &mut BTreeMap<u64, String>,
) {
    for seed in seeds {
        let door = doors[seed as usize % 2];
        let (id, sum) = tokio::time::timeout(GUARD, upload(door, seed))
            .await
            .unwrap_or_else(|_| panic!("upload {seed} waited past {GUARD:?}\n{}", door.log()))
            .unwrap_or_else(|e| {
                panic!("upload {seed} while {away} is away: {e:?}\n{}", door.log())
            });
        let holders = copies(door, id).await;
        assert_eq!(holders.len(), 2, "photo {id}: {holders:?}");
        assert!(
            !holders.iter().any(|h| h == away),
            "photo {id}: {holders:?}"
        );
        acked.insert(id, sum);
    }
}

async fn detour_on(url: &str) {
    // A lease far longer than the test: placement keeps naming the node that is away.
    let tuner = TunerProcess::start_with(&["--catalog", url, "--node-lease-ms", "600000"]);
    let extra = [
        "--copy-timeout-ms",
        COPY_TIMEOUT_MS,
        "--peer-timeout-ms",
        "30000",
    ];
    let mut nodes: Vec<Instance> = NAMES
        .iter()
        .map(|name| replicated_node(url, &tuner, name, &extra).0)
        .collect();
    tuner.wait_for_nodes(3).await;
    let mut acked = BTreeMap::new();

    nodes[2].signal("STOP");
    upload_around([&nodes[0], &nodes[1]], NAMES[2], 0..24, &mut acked).await;
    nodes[2].signal("CONT");

    nodes[2].kill9();
    upload_around([&nodes[0], &nodes[1]], NAMES[2], 24..48, &mut acked).await;

    // Back: rebalancing moves the photos whose placement names it onto it, two copies each.
    nodes[2].restart();
    let mut polls = 0;
    loop {
        let mut on_c = 0;
        for id in acked.keys() {
            let holders = copies(&nodes[0], *id).await;
            assert!((2..=3).contains(&holders.len()), "photo {id}: {holders:?}");
            on_c += usize::from(holders.iter().any(|h| h == NAMES[2]));
        }
        if on_c > 0 {
            break;
        }
        polls += 1;
        assert!(
            polls < POLLS,
            "no photo moved back to {}\n{}",
            NAMES[2],
            nodes[0].log()
        );
        tokio::time::sleep(POLL).await;
    }
    for (id, sum) in &acked {
        let (status, body) = nodes[2].get(&format!("/v1/photos/{id}")).await;
        assert_eq!(status, 200, "photo {id} through the restarted node");
        assert_eq!(&sha256(&body), sum, "photo {id}");
    }
}

#[test]
fn leases_that_could_not_be_renewed_do_not_stop_uploads() {
    on_postgres("lapsed", |url| async move { lapsed_on(&url).await });
}

/// Whether every node `node` lists in `/v1/cluster` has a live lease.
async fn leases_live(node: &Instance) -> Vec<bool> {
    let status = node.json("/v1/cluster").await;
    status["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("{status}"))
        .iter()
        .map(|n| n["live"].as_bool().unwrap())
        .collect()
}

async fn lapsed_on(url: &str) {
    let tuner = TunerProcess::start_with(&["--catalog", url, "--node-lease-ms", "3000"]);
    let nodes: Vec<Instance> = ["lp-a", "lp-b", "lp-c"]
        .iter()
        .map(|name| replicated_node(url, &tuner, name, &["--copy-timeout-ms", COPY_TIMEOUT_MS]).0)
        .collect();
    tuner.wait_for_nodes(3).await;
    // The Tuner renews no lease while it is stopped, as when it cannot reach the catalog.
    tuner.signal_stop();
    let mut polls = 0;
    while leases_live(&nodes[0]).await.contains(&true) {
        polls += 1;
        assert!(polls < POLLS, "the leases never ran out");
        tokio::time::sleep(POLL).await;
    }
    let mut acked = BTreeMap::new();
    for seed in 0..12u32 {
        let door = &nodes[seed as usize % 3];
        let (id, sum) = tokio::time::timeout(GUARD, upload(door, seed))
            .await
            .unwrap_or_else(|_| panic!("upload {seed} waited past {GUARD:?}\n{}", door.log()))
            .unwrap_or_else(|e| panic!("upload {seed} with lapsed leases: {e:?}\n{}", door.log()));
        assert_eq!(copies(door, id).await.len(), 2, "photo {id}");
        acked.insert(id, sum);
    }
    tuner.signal_cont();
    for (id, sum) in &acked {
        let (status, body) = nodes[1].get(&format!("/v1/photos/{id}")).await;
        assert_eq!(status, 200, "photo {id}");
        assert_eq!(&sha256(&body), sum, "photo {id}");
    }
}

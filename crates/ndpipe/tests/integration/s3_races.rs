//! Conditional writes through two front doors of a replicated cluster: two PipeStores on one
//! PostgreSQL catalog with two copies of everything, each with its S3 API. Eight boto3
//! writers, alternating between the two, create one key with `If-None-Match: *`, then eight
//! replace it with `If-Match` and the winner's ETag, for a photo and for a plain object:
//! exactly one wins each time, both doors read its bytes, and nothing is left of the others
//! (one photo, and two copies of one plain object's file).

use crate::common::on_postgres;
use crate::replication::cluster_of;
use crate::s3::boto3_at;
use crate::s3::conditional::{RACE, one_winner_each, race_inputs};

#[test]
fn racing_conditional_puts_through_two_nodes_have_one_winner() {
    on_postgres("s3_races", |url| async move { races_on(&url).await });
}

async fn races_on(url: &str) {
    let (tuner, nodes, s3_ports) = cluster_of(url, &["sr-a", "sr-b"], &[]);
    tuner.wait_for_nodes(2).await;
    let doors: Vec<String> = s3_ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let work = tempfile::tempdir().unwrap();
    let script = format!("{}{RACE}", race_inputs(work.path()));
    let out = boto3_at(&[&doors[0], &doors[1]], &script)
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", nodes[0].log(), nodes[1].log()));
    one_winner_each(&out);
    for node in &nodes {
        let photos = node.json("/v1/photos").await;
        assert_eq!(
            photos["photos"].as_array().unwrap().len(),
            1,
            "only the last winner's photo is left: {photos}"
        );
        assert_eq!(
            node.plain_object_files().len(),
            1,
            "each node holds one copy of the last winner's file"
        );
    }
    drop(tuner);
}

//! gRPC between the Tuner and the PipeStores over mutual TLS (certificates made with the
//! `openssl` tool for the test): a cluster whose processes share the CA fine-tunes, a node
//! without TLS cannot join, and a client whose certificate another CA signed is refused.

use std::path::Path;
use std::process::Command;

use ndpipe_proto::PROTOCOL_VERSION;
use ndpipe_proto::pb::{self, tuner_client::TunerClient};
use ndpipe_proto::transport::{self, Tls};

use crate::common::{Instance, TunerProcess};

/// Runs openssl in `dir`; panics with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("running openssl (tools/setup.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `name` in `dir` and a certificate it signs for 127.0.0.1 (server and client use):
/// `{name}-ca.pem`, `{name}.pem`, `{name}.key`.
fn make_certs(dir: &Path, name: &str) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let (ca_key, ca) = (format!("{name}-ca.key"), format!("{name}-ca.pem"));
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", "/CN=ndpipe test CA"];
    args.extend(ec);
    args.extend(["-keyout", &ca_key, "-out", &ca]);
    openssl(dir, &args);
    let (key, csr, cert) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    let mut args = vec!["req", "-subj", "/CN=ndpipe node"];
    args.extend(ec);
    args.extend(["-keyout", &key, "-out", &csr]);
    openssl(dir, &args);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-extfile",
            "ext.cnf",
            "-out",
            &cert,
        ],
    );
}

#[tokio::test]
async fn a_cluster_on_mutual_tls_finetunes_and_refuses_peers_without_the_cas_certificate() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), "cluster");
    make_certs(dir.path(), "stranger");
    let file = |f: &str| dir.path().join(f).to_string_lossy().to_string();
    let (cert, key, ca) = (
        file("cluster.pem"),
        file("cluster.key"),
        file("cluster-ca.pem"),
    );
    let tls = ["--tls-cert", &cert, "--tls-key", &key, "--tls-ca", &ca];
    let tuner = TunerProcess::start_with(&tls);
    let url = tuner.grpc.replace("http://", "https://");
    let a = Instance::start_pipestore(&url, "ps-a", &tls);
    let b = Instance::start_pipestore(&url, "ps-b", &tls);
    crate::common::import_fashion(&a, 0, 70);
    crate::common::import_fashion(&b, 70, 70);
    let nodes = tuner.wait_for_nodes(2).await;
    for n in nodes.as_array().unwrap() {
        assert!(
            n["url"].as_str().unwrap().starts_with("https://"),
            "{nodes}"
        );
    }
    let (status, job) = tuner
        .run_job(
            "/v1/tuner/finetune",
            serde_json::json!({"runs": 1, "epochs": 2, "load_balance": false}),
        )
        .await;
    assert_eq!(
        (status, &job["phase"]),
        (202, &serde_json::json!("done")),
        "{job}\n{}",
        tuner.log()
    );

    // A client whose certificate another CA signed gets no answer from the Tuner, nor one
    // without a certificate, nor one speaking plaintext.
    let register = pb::RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        grpc_url: "https://127.0.0.1:9".into(),
        name: "intruder".into(),
        active_version: String::new(),
        replicas: 1,
    };
    let stranger = Tls::load(
        Path::new(&file("stranger.pem")),
        Path::new(&file("stranger.key")),
        Path::new(&file("stranger-ca.pem")),
    )
    .unwrap();
    let trusting = Tls::load(
        Path::new(&file("stranger.pem")),
        Path::new(&file("stranger.key")),
        Path::new(&ca),
    )
    .unwrap();
    for (who, channel) in [
        (
            "another CA's client",
            transport::channel(&url, Some(&stranger)).unwrap(),
        ),
        (
            "a client certificate the CA did not sign",
            transport::channel(&url, Some(&trusting)).unwrap(),
        ),
        ("plaintext", transport::channel(&tuner.grpc, None).unwrap()),
    ] {
        let refused = TunerClient::new(channel).register(register.clone()).await;
        assert!(refused.is_err(), "{who} must be refused");
    }
    let names: Vec<String> = tuner
        .get("/v1/tuner/nodes")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["ps-a", "ps-b"], "nobody else registered");
}

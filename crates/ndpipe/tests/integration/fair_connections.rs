//! Issue 25 item 6: one client address holding idle connections gets its share of the
//! connection cap and no more, so that other addresses are still served; health probes answer
//! when every slot is taken; a body that trickles is cut. Loopback answers every 127.x.y.z, so
//! a client socket bound to 127.0.0.2 is another client. Time limits are hang guards.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::common::Instance;

/// A connection to `inst` from the address `from`, with a 20 s read timeout (hang guard).
fn connect_from(inst: &Instance, from: [u8; 4]) -> TcpStream {
    let server: SocketAddr = inst.url.trim_start_matches("http://").parse().unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    socket.connect(&server.into()).unwrap();
    let stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
}

/// Opens connections from `from` until the server closes one unasked (its share is full);
/// the ones it keeps. The server accepts in order, so once the extra one is closed the kept
/// ones hold their slots. Fails when more than `bound` are kept.
fn hold_share(inst: &Instance, from: [u8; 4], bound: usize) -> Vec<TcpStream> {
    let mut kept = Vec::new();
    loop {
        let mut probe = connect_from(inst, from);
        let mut buf = [0u8; 64];
        // The kept connections are not written to: only a closed one reads (0 bytes) at once.
        probe
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        match probe.read(&mut buf) {
            Ok(0) => return kept,
            Ok(n) => panic!("the server sent {n} bytes unasked"),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                probe
                    .set_read_timeout(Some(Duration::from_secs(20)))
                    .unwrap();
                kept.push(probe);
                assert!(
                    kept.len() <= bound,
                    "{} connections from {from:?} are all kept",
                    kept.len()
                );
            }
            Err(_) => return kept,
        }
    }
}

/// Sends a GET of `path` on a new connection from `from`; the whole answer. A probe's slot
/// (one per address) comes back only once the server has seen the previous connection end, so
/// a connection closed unanswered is retried, a bounded number of times.
fn get_from(inst: &Instance, from: [u8; 4], path: &str) -> String {
    for _ in 0..100 {
        let mut stream = connect_from(inst, from);
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let _ = stream.write_all(request.as_bytes());
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out);
        if !out.is_empty() {
            return String::from_utf8_lossy(&out).into_owned();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no answer to {path} from {from:?} in 100 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holding_its_share_does_not_lock_others_out() {
    let inst = Instance::start_with(&[
        "--max-connections",
        "16",
        "--max-connections-per-client",
        "4",
        "--header-timeout-ms",
        "60000",
    ]);
    let flood = tokio::task::block_in_place(|| hold_share(&inst, [127, 0, 0, 2], 8));
    assert_eq!(flood.len(), 4, "the flooding address keeps its share");
    for i in 0..10 {
        let (status, body) = inst.upload(crate::common::jpeg(64, 48, i), "").await;
        assert_eq!(status, 201, "upload {i} from another address: {body}");
    }
    assert_eq!(inst.counts().await.0, 10);
    drop(flood);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_answer_when_every_slot_is_taken() {
    let inst = Instance::start_with(&[
        "--max-connections",
        "4",
        "--max-connections-per-client",
        "2",
        "--header-timeout-ms",
        "60000",
    ]);
    let flood = tokio::task::block_in_place(|| {
        [[127, 0, 0, 2], [127, 0, 0, 3]].map(|from| hold_share(&inst, from, 2))
    });
    assert_eq!(
        flood.iter().map(Vec::len).sum::<usize>(),
        4,
        "the flood holds every slot"
    );
    let (health, ready, photos) = tokio::task::block_in_place(|| {
        (
            get_from(&inst, [127, 0, 0, 1], "/healthz"),
            get_from(&inst, [127, 0, 0, 1], "/readyz"),
            get_from(&inst, [127, 0, 0, 1], "/v1/photos"),
        )
    });
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(photos.starts_with("HTTP/1.1 503"), "{photos}");
    assert!(photos.contains("\"server_busy\""), "{photos}");
    drop(flood);
}

#[test]
fn a_body_that_trickles_is_cut() {
    let inst = Instance::start_with(&["--body-idle-timeout-ms", "1000", "--min-body-rate", "1024"]);
    let mut stream = connect_from(&inst, [127, 0, 0, 1]);
    stream
        .write_all(b"POST /v1/photos HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    // 16 bytes every 250 ms, each piece well within the idle deadline; 200 pieces at most
    // (the hang guard: the whole body would take over 25 minutes).
    for _ in 0..200 {
        if stream.write_all(&[0u8; 16]).is_err() {
            break;
        }
        stream.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1];
        let peek = stream.peek(&mut buf);
        stream.set_nonblocking(false).unwrap();
        if peek.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let answer = String::from_utf8_lossy(&out);
    assert!(
        answer.starts_with("HTTP/1.1 400"),
        "the trickle was not cut: {answer}"
    );
    assert!(answer.contains("min_body_rate"), "{answer}");
    let (photos, _) = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(inst.counts());
    assert_eq!(photos, 0);
}

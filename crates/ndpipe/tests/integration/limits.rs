//! Slow and greedy clients: a request whose headers stall is cut off, a body that stops
//! arriving fails, and connections beyond the cap are closed while the store keeps serving.
//! Time limits are hang guards.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::Instance;

fn connect(inst: &Instance) -> TcpStream {
    let addr = inst.url.trim_start_matches("http://");
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
}

/// Reads until the server closes the connection; what it sent. The socket's 20 s read
/// timeout is the hang guard: a server that holds the connection fails the test.
fn read_to_close(mut stream: TcpStream) -> String {
    let mut out = Vec::new();
    if let Err(e) = stream.read_to_end(&mut out) {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the server held the connection: {e}"
        );
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn stalled_headers_and_bodies_are_cut_off_and_extra_connections_closed() {
    let inst = Instance::start_with(&[
        "--header-timeout-ms",
        "500",
        "--body-idle-timeout-ms",
        "500",
        "--max-connections",
        "4",
    ]);
    // Half a request line: the connection is closed, with no answer.
    let mut half = connect(&inst);
    half.write_all(b"GET /heal").unwrap();
    let answer = read_to_close(half);
    assert!(!answer.contains("200 OK"), "{answer}");

    // A body that stops arriving: the upload fails with a 4xx, and nothing is stored.
    let mut slow = connect(&inst);
    slow.write_all(
        b"POST /v1/photos HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n\x89PNG",
    )
    .unwrap();
    let answer = read_to_close(slow);
    let status: u16 = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!((400..500).contains(&status), "{answer}");

    // Four idle connections take every slot: a fifth is answered only on a probe's slot (503
    // to anything but /healthz and /readyz); once they go, it is served.
    let held: Vec<TcpStream> = (0..4).map(|_| connect(&inst)).collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut extra = connect(&inst);
    let _ = extra.write_all(b"GET /v1/photos HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let answer = read_to_close(extra);
    assert!(
        !answer.contains("200 OK"),
        "a fifth connection is served: {answer}"
    );
    drop(held);
    // The held connections' slots free up as the server sees them close: a bounded retry.
    let served_again = (0..200).any(|_| {
        let mut again = connect(&inst);
        let _ = again.write_all(b"GET /v1/photos HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let ok = read_to_close(again).contains("200 OK");
        if !ok {
            std::thread::sleep(Duration::from_millis(100));
        }
        ok
    });
    assert!(served_again, "the store never served again");
    let (photos, _) = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(inst.counts());
    assert_eq!(photos, 0, "the stalled upload stored nothing");
}

#[tokio::test]
async fn a_photo_larger_than_the_decode_budget_is_decoded_alone_not_refused() {
    let inst = Instance::start_with(&["--decode-budget-bytes", "1"]);
    let uploads = (0..4).map(|seed| inst.upload(crate::common::jpeg(640, 480, seed), ""));
    for (status, body) in futures::future::join_all(uploads).await {
        assert_eq!(status, 201, "{body}");
    }
    assert_eq!(inst.counts().await, (4, 4));
}

/// Sends an upload's headers and the first 10 bytes of `photo`: it stays in flight.
fn start_held_upload(inst: &Instance, photo: &[u8]) -> TcpStream {
    let mut held = connect(inst);
    let head = format!(
        "POST /v1/photos HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n",
        photo.len()
    );
    held.write_all(head.as_bytes()).unwrap();
    held.write_all(&photo[..10]).unwrap();
    held
}

/// What the server has answered on `stream` so far, without waiting.
fn answered(stream: &mut TcpStream) -> Option<String> {
    stream.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let read = stream.read(&mut buf);
    stream.set_nonblocking(false).unwrap();
    match read {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(e) => panic!("the held upload's connection failed: {e}"),
    }
}

/// Issue 14 part 4: one client may have `--max-uploads-per-client` uploads in flight; one more
/// is answered 429 with a JSON body before its body is read, reads go on, and once the held
/// upload ends the client may upload again.
#[tokio::test]
async fn uploads_over_the_per_client_cap_answer_429_with_json() {
    let inst = Instance::start_with(&["--max-uploads-per-client", "1"]);
    let photo = crate::common::jpeg(64, 48, 1);
    // An upload whose body is still arriving holds the client's one slot once the server has
    // its headers. Until then the probes below are served; a probe in flight when the held
    // upload's headers arrive makes the held one the refused one, and it is sent again.
    let mut held = start_held_upload(&inst, &photo);
    let mut refused = None;
    for _ in 0..100 {
        let (status, body) = inst.upload(crate::common::jpeg(64, 48, 2), "").await;
        if status == 429 {
            refused = Some(body);
            break;
        }
        // The same probe again is answered with the photo it stored first (200).
        assert!(matches!(status, 200 | 201), "{status} {body}");
        if let Some(answer) = answered(&mut held) {
            assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
            held = start_held_upload(&inst, &photo);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = refused.expect("a second upload of the same client was never refused");
    assert_eq!(body["error"], "too_many_uploads", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--max-uploads-per-client")
    );
    // Reads are not uploads.
    assert_eq!(inst.json("/healthz").await["status"], "ok");
    // The held upload completes; its slot comes back.
    held.write_all(&photo[10..]).unwrap();
    let answer = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 512];
        let n = held.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let (status, body) = inst.upload(crate::common::jpeg(64, 48, 3), "").await;
    assert_eq!(status, 201, "{body}");
}

//! The intake's bookkeeping: runs, take-overs, validation sets, bad chunks and lost nodes.

use ndpipe_proto::encode_chunk;
use pb::Part;

use super::*;

fn features(ids: std::ops::Range<u64>, dim: usize) -> Features {
    let n = ids.end - ids.start;
    Features {
        values: vec![0.5; n as usize * dim],
        dim,
        labels: ids.clone().map(|i| (i % 2) as u32).collect(),
        photo_ids: ids.collect(),
    }
}

fn chunk(part: Part, run: u32, seq: u32, ids: std::ops::Range<u64>) -> Event {
    Event::Chunk(encode_chunk(part, run, seq, &features(ids, 2)))
}

fn ready(part: Part, run: u32) -> Event {
    Event::RunReady(pb::RunReady {
        part: part as i32,
        run,
        ..Default::default()
    })
}

fn done() -> Event {
    Event::Done(pb::ExtractDone {
        images: 0,
        seconds: 1.5,
        extracted: 3,
        deleted: 0,
        ..Default::default()
    })
}

/// Feeds an event; adds the chunk it yields, if any.
fn feed(intake: &mut Intake, source: Source, event: Event) -> Result<bool, TunerError> {
    match intake.on_event(source, event) {
        Some(c) => {
            let f = ndpipe_proto::decode_chunk(&c, intake.classes()).unwrap();
            intake.add(source, c.part, c.run, f).map(|()| true)
        }
        None => Ok(false),
    }
}

fn intake(by_reference: bool) -> Intake {
    Intake::new(
        vec!["a (node 1)".into(), "b (node 2)".into()],
        2,
        2,
        2,
        by_reference,
    )
}

#[test]
fn runs_are_ready_when_every_node_sent_them_and_duplicates_are_dropped() {
    let mut i = intake(false);
    let (a, b) = (Source::Node(0), Source::Node(1));
    assert!(feed(&mut i, a, chunk(Part::Val, 0, 0, 0..4)).unwrap());
    assert!(
        !feed(&mut i, a, chunk(Part::Val, 0, 0, 0..4)).unwrap(),
        "a duplicate"
    );
    feed(&mut i, a, ready(Part::Val, 0)).unwrap();
    feed(&mut i, a, chunk(Part::Train, 0, 1, 10..16)).unwrap();
    feed(&mut i, a, ready(Part::Train, 0)).unwrap();
    assert!(!i.all_val_ready());
    assert!(i.next_ready_run().is_none(), "b has sent nothing");
    feed(&mut i, b, ready(Part::Val, 0)).unwrap();
    feed(&mut i, b, chunk(Part::Train, 0, 0, 20..22)).unwrap();
    assert!(i.next_ready_run().is_none(), "b has not finished run 0");
    feed(&mut i, b, ready(Part::Train, 0)).unwrap();
    assert!(i.all_val_ready());
    let (run, data) = i.next_ready_run().unwrap();
    assert_eq!((run, data.len()), (0, 8));
    assert!(i.next_ready_run().is_none(), "run 1 is not there yet");
    assert_eq!(i.val().photo_ids, [0, 1, 2, 3]);
    assert_eq!(i.images(), 12);
    let per_image = 2 * 2 + 4 + 8;
    assert_eq!(i.bytes(), 12 * per_image);
}

#[test]
fn the_last_run_waits_for_take_overs_credited_to_the_fast_node() {
    let mut i = intake(true);
    let (a, b) = (Source::Node(0), Source::Node(1));
    for s in [a, b] {
        for event in [
            ready(Part::Val, 0),
            ready(Part::Train, 0),
            ready(Part::Train, 1),
        ] {
            feed(&mut i, s, event).unwrap();
        }
    }
    feed(&mut i, b, chunk(Part::Train, 1, 0, 0..3)).unwrap();
    let k = i.add_takeover(1, 0, BTreeSet::from([1]));
    let t = Source::TakeOver(k);
    assert_eq!(
        i.next_ready_run().map(|r| r.0),
        Some(0),
        "run 0 moved nowhere"
    );
    assert!(i.next_ready_run().is_none(), "the take-over is not done");
    // The take-over's sequence numbers may equal a node's: they are its own.
    assert!(feed(&mut i, t, chunk(Part::Train, 1, 0, 100..102)).unwrap());
    assert!(i.on_ended(t).is_err());
    feed(&mut i, t, done()).unwrap();
    assert!(i.on_ended(t).is_ok());
    let (run, data) = i.next_ready_run().unwrap();
    assert_eq!(run, 1);
    let RunData::Remote(rows) = data else {
        panic!("by reference");
    };
    assert_eq!(rows.len(), 5);
    assert!(
        rows.iter().all(|r| r.node == 1),
        "photos stay b's: {rows:?}"
    );
    let reports = i.node_reports();
    assert_eq!((reports[0].images, reports[1].images), (2, 3));
}

#[test]
fn bad_chunks_and_early_ends_name_the_node() {
    let mut i = intake(false);
    let a = Source::Node(0);
    let wrong_dim = Event::Chunk(encode_chunk(Part::Train, 0, 0, &features(0..2, 3)));
    let err = feed(&mut i, a, wrong_dim).unwrap_err();
    assert!(err.to_string().contains("a (node 1)") && err.to_string().contains("3-d"));
    let err = feed(&mut i, a, chunk(Part::Train, 5, 1, 0..2)).unwrap_err();
    assert!(err.to_string().contains("run 5 of 2"), "{err}");
    assert!(i.on_ended(a).is_err());
    feed(&mut i, a, done()).unwrap();
    assert!(i.on_ended(a).is_ok());
    assert!(!i.all_done());
    let k = i.add_takeover(1, 0, BTreeSet::from([0]));
    let err = i.blame(Source::TakeOver(k), "checksum mismatch");
    let text = err.to_string();
    assert!(
        text.contains("a (node 1)") && text.contains("b (node 2)"),
        "{text}"
    );
}

#[test]
fn photos_an_ancestor_trained_on_never_validate_and_training_photos_are_recorded() {
    let mut i = intake(false);
    let (a, b) = (Source::Node(0), Source::Node(1));
    i.leave_out_of_val(vec![HashSet::from([1, 2]), HashSet::new()]);
    feed(&mut i, a, chunk(Part::Val, 0, 0, 0..4)).unwrap();
    feed(&mut i, b, chunk(Part::Val, 0, 0, 0..4)).unwrap();
    assert_eq!(i.val_left_out(), 2, "only node a's photos 1 and 2");
    let val = i.val();
    assert_eq!(val.photo_ids, [0, 3, 0, 1, 2, 3]);
    assert_eq!((val.labels.len(), val.values.len()), (6, 12));
    feed(&mut i, b, chunk(Part::Train, 1, 0, 7..9)).unwrap();
    feed(&mut i, b, chunk(Part::Train, 0, 0, 5..7)).unwrap();
    assert_eq!(i.trained(), [vec![], vec![5, 6, 7, 8]]);
}

#[test]
fn a_run_waits_for_each_take_over_holding_its_photos_and_rates_come_late_without_val() {
    let mut i = intake(false);
    let (a, b) = (Source::Node(0), Source::Node(1));
    let throughput = |done, total| {
        Event::Throughput(pb::Throughput {
            images_per_second: 10.0,
            done,
            total,
        })
    };
    // No validation photos: the rates are known only after a training chunk.
    for s in [a, b] {
        feed(&mut i, s, ready(Part::Val, 0)).unwrap();
    }
    assert!(i.all_val_ready() && !i.rates_known());
    feed(&mut i, a, throughput(8, 40)).unwrap();
    assert!(!i.rates_known(), "b has measured nothing");
    feed(&mut i, b, throughput(2, 40)).unwrap();
    assert!(i.rates_known());
    assert_eq!(i.remaining(), [32, 38]);
    // b's photos of runs 0 and 1 move to a.
    let k = i.add_takeover(1, 0, BTreeSet::from([0, 1]));
    let t = Source::TakeOver(k);
    for s in [a, b] {
        feed(&mut i, s, ready(Part::Train, 0)).unwrap();
        feed(&mut i, s, ready(Part::Train, 1)).unwrap();
    }
    assert!(
        i.next_ready_run().is_none(),
        "run 0 waits for the take-over"
    );
    feed(&mut i, t, chunk(Part::Train, 0, 0, 50..52)).unwrap();
    feed(&mut i, t, ready(Part::Train, 0)).unwrap();
    let (run, data) = i.next_ready_run().unwrap();
    assert_eq!((run, data.len()), (0, 2));
    assert!(i.next_ready_run().is_none(), "run 1 still waits");
    assert!(!i.all_done());
    feed(&mut i, t, chunk(Part::Train, 1, 1, 52..53)).unwrap();
    feed(&mut i, t, ready(Part::Train, 1)).unwrap();
    assert_eq!(i.next_ready_run().map(|r| r.0), Some(1));
    assert_eq!(
        i.trained(),
        [vec![], vec![50, 51, 52]],
        "b's photos stay b's"
    );
}

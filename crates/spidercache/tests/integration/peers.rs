//! Hand-checked rules of SHADE, iCache and Quiver.

use std::sync::Arc;

use crate::common::Dataset;
use bytes::Bytes;
use spidercache::{
    Answer, CachePolicy, Capacity, ICache, ICacheConfig, LabelSource, MemorySource, Quiver,
    QuiverConfig, Sample, SampleId, Shade, ShadeConfig, TrainingSpec,
};

fn samples(n: usize) -> Vec<Sample> {
    (0..n)
        .map(|i| Sample {
            label: (i % 3) as u32,
            data: Bytes::from(vec![i as u8; 10]),
        })
        .collect()
}

#[test]
fn shade_weights_loss_ranks_and_replicates_cached_samples() {
    let data = Dataset::clustered(20, 2, 3);
    let spec = TrainingSpec {
        num_samples: 20,
        batch_size: 20,
        seed: 9,
    };
    let shade = Shade::new(ShadeConfig::default(), spec, Capacity::new(4, 10_000)).unwrap();
    shade.begin_epoch(0).unwrap();
    for id in 0..4 {
        assert!(shade.admit(id, data.samples[id as usize].clone()).unwrap());
    }
    let ids: Vec<SampleId> = (0..20).collect();
    data.report(&shade, &ids, |id| id as f32);
    // The smallest loss (id 0) ranks 0: ln(10); the largest (id 19): ln(29).
    assert!((shade.weight(0).unwrap() - 10f64.ln()).abs() < 1e-9);
    assert!((shade.weight(19).unwrap() - 29f64.ln()).abs() < 1e-9);
    // Ghost of 19 outranks every cached id: it displaces the minimum, id 0.
    assert!(shade.admit(19, data.samples[19].clone()).unwrap());
    assert!(matches!(shade.lookup(0, 0).unwrap(), Answer::Miss));
    shade.end_epoch(Some(0.1)).unwrap();
    shade.begin_epoch(1).unwrap();
    let mut order = Vec::new();
    while let Some(b) = shade.next_batch() {
        order.extend(b);
    }
    assert_eq!(order.len(), 20);
    // The drawn cached ids (1, 2, 3, 19) come first, three copies each.
    let cached = |id: &SampleId| [1, 2, 3, 19].contains(id);
    let hits = order.iter().take_while(|id| cached(id)).count();
    assert!(hits > 0 && hits % 3 == 0, "hits {hits} in {order:?}");
    assert!(order[hits..].iter().all(|id| !cached(id)));
}

fn icache(n: usize, capacity: Capacity, config: ICacheConfig) -> (ICache, Arc<MemorySource>) {
    let src = Arc::new(MemorySource::new(samples(n)));
    let spec = TrainingSpec {
        num_samples: n,
        batch_size: n,
        seed: 4,
    };
    (
        ICache::new(config, spec, capacity, src.clone()).unwrap(),
        src,
    )
}

fn report_losses(p: &dyn CachePolicy, n: u64, loss: impl Fn(u64) -> f32) {
    let ids: Vec<SampleId> = (0..n).collect();
    let labels: Vec<u32> = ids.iter().map(|&i| (i % 3) as u32).collect();
    let losses: Vec<f32> = ids.iter().map(|&i| loss(i)).collect();
    p.report_batch(&spidercache::BatchReport {
        ids: &ids,
        labels: &labels,
        embeddings: &[],
        dim: 0,
        losses: &losses,
    })
    .unwrap();
}

#[test]
fn icache_h_cache_fills_in_full_epochs_and_displaces_in_selective_ones() {
    let config = ICacheConfig {
        warm_up: 1,
        reuse_factor: 100,
        h_fraction: 0.5,
        ..ICacheConfig::default()
    };
    let (ic, src) = icache(10, Capacity::new(4, 1000), config);
    let get = |id: u64| spidercache::SampleSource::fetch(&*src, id).unwrap();
    ic.begin_epoch(0).unwrap();
    assert!(
        ic.is_important(5),
        "every sample is important in a full epoch"
    );
    assert!(ic.admit(0, get(0)).unwrap());
    assert!(ic.admit(1, get(1)).unwrap());
    assert!(!ic.admit(2, get(2)).unwrap(), "full epochs never evict");
    assert_eq!(
        ic.lookup(2, 2).unwrap(),
        Answer::Miss,
        "important requests are not substituted"
    );
    report_losses(&ic, 10, |i| i as f32);
    ic.end_epoch(None).unwrap();

    // Epoch 1 is selective: the top 70% by loss (ids 3..=9) are important.
    ic.begin_epoch(1).unwrap();
    assert!(ic.is_important(3) && !ic.is_important(2));
    assert!(matches!(ic.lookup(0, 0).unwrap(), Answer::Hit(_)));
    match ic.lookup(2, 2).unwrap() {
        Answer::Substitute {
            served,
            label,
            label_source,
            ..
        } => {
            assert_eq!(label_source, LabelSource::Served);
            assert_eq!(label, get(served).label, "the served sample's own label");
        }
        other => panic!("unimportant request should be substituted, got {other:?}"),
    }
    assert!(
        !ic.admit(2, get(2)).unwrap(),
        "unimportant samples are not cached"
    );
    // Importance of 9 (loss 9) beats the heap minimum, id 0 (loss 0).
    assert!(ic.admit(9, get(9)).unwrap());
    assert!(
        !matches!(ic.lookup(0, 0).unwrap(), Answer::Hit(_)),
        "0 was displaced"
    );
    assert!(ic.admit(3, get(3)).unwrap(), "3 > 1, the new minimum");
    assert!(matches!(ic.lookup(9, 0).unwrap(), Answer::Hit(_)));
    assert!(ic.usage().within(ic.capacity()));
}

#[test]
fn icache_selective_epochs_train_fewer_samples_reproducibly() {
    let config = ICacheConfig {
        warm_up: 1,
        reuse_factor: 100,
        history: 16,
        ..ICacheConfig::default()
    };
    let order = || {
        let (ic, _) = icache(200, Capacity::new(20, 10_000), config.clone());
        ic.begin_epoch(0).unwrap();
        report_losses(&ic, 200, |i| ((i * 37) % 200) as f32);
        ic.end_epoch(None).unwrap();
        ic.begin_epoch(1).unwrap();
        let mut all = Vec::new();
        while let Some(b) = ic.next_batch() {
            all.extend(b);
        }
        all
    };
    let first = order();
    assert!(
        first.len() < 200 && first.len() > 50,
        "kept {}",
        first.len()
    );
    assert_eq!(first, order());
}

#[test]
fn quiver_consumes_once_and_fills_with_own_label_substitutes() {
    let n = 20;
    let src = Arc::new(MemorySource::new(samples(n)));
    let spec = TrainingSpec {
        num_samples: n,
        batch_size: 4,
        seed: 2,
    };
    let q = Quiver::new(
        QuiverConfig::default(),
        spec,
        Capacity::new(4, 1000),
        src.clone(),
    )
    .unwrap();
    assert!(
        !q.admit(0, samples(1).remove(0)).unwrap(),
        "Quiver caches only what it loads"
    );
    q.begin_epoch(0).unwrap();
    assert_eq!(q.usage().items, 4, "two packages of cache/2");
    let mut slots = 0;
    let mut hits = 0;
    while let Some(batch) = q.next_batch() {
        slots += batch.len();
        for &id in &batch {
            match q.lookup(id, (id % 3) as u32).unwrap() {
                Answer::Hit(_) => {
                    hits += 1;
                    // Consumed: a second request cannot be an exact hit.
                    assert!(!matches!(q.lookup(id, 0).unwrap(), Answer::Hit(_)));
                    slots += 1;
                }
                Answer::Substitute {
                    served,
                    label,
                    label_source,
                    ..
                } => {
                    assert_eq!(label_source, LabelSource::Served);
                    assert_eq!(label, (served % 3) as u32);
                }
                Answer::Miss => {}
            }
            assert!(q.usage().within(q.capacity()));
        }
    }
    assert_eq!(slots - hits, n, "an epoch serves N slots");
    let stats = q.end_epoch(None).unwrap();
    assert!(stats.exact_hits >= hits as u64 && stats.substitutes > 0);
    assert!(stats.background_fetches >= 4);
}

#[test]
fn quiver_over_probe_puts_cached_ids_first() {
    let n = 40;
    let src = Arc::new(MemorySource::new(samples(n)));
    let spec = TrainingSpec {
        num_samples: n,
        batch_size: 4,
        seed: 5,
    };
    // Probing 10x the batch covers the whole queue, so all 4 ids of the served package are found.
    let config = QuiverConfig {
        probe_multiple: Some(10.0),
    };
    let q = Quiver::new(config, spec, Capacity::new(8, 1000), src).unwrap();
    q.begin_epoch(0).unwrap();
    let batch = q.next_batch().unwrap();
    assert_eq!(batch.len(), 4);
    for id in batch {
        assert!(
            matches!(q.lookup(id, 0).unwrap(), Answer::Hit(_)),
            "{id} should be cached"
        );
    }
}

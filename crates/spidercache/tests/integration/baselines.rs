//! Hand-checked admission and eviction of the uniform baselines.

use bytes::Bytes;
use spidercache::{
    Answer, CachePolicy, Capacity, LfuCache, LruCache, NoCache, Sample, StaticCache, TrainingSpec,
};

fn spec() -> TrainingSpec {
    TrainingSpec {
        num_samples: 10,
        batch_size: 5,
        seed: 1,
    }
}

fn s(len: usize) -> Sample {
    Sample {
        label: 0,
        data: Bytes::from(vec![7u8; len]),
    }
}

fn hit(p: &dyn CachePolicy, id: u64) -> bool {
    matches!(p.lookup(id, 0).unwrap(), Answer::Hit(_))
}

#[test]
fn lru_evicts_the_least_recent() {
    let lru = LruCache::new(spec(), Capacity::new(2, 100)).unwrap();
    assert!(lru.admit(0, s(1)).unwrap());
    assert!(lru.admit(1, s(1)).unwrap());
    assert!(hit(&lru, 0), "0 becomes most recent");
    assert!(lru.admit(2, s(1)).unwrap());
    assert!(lru.contains(0) && lru.contains(2) && !lru.contains(1));
    assert!(lru.admit(3, s(1)).unwrap());
    assert!(!lru.contains(0), "0 is now the least recent");
}

#[test]
fn lru_evicts_as_many_as_the_bytes_need() {
    let lru = LruCache::new(spec(), Capacity::new(10, 30)).unwrap();
    for id in 0..3 {
        lru.admit(id, s(10)).unwrap();
    }
    assert!(lru.admit(3, s(25)).unwrap());
    assert_eq!(lru.usage(), Capacity::new(1, 25));
    assert!(
        !lru.admit(4, s(31)).unwrap(),
        "larger than the whole budget"
    );
    assert!(lru.contains(3));
}

#[test]
fn lfu_evicts_the_least_frequent() {
    let lfu = LfuCache::new(spec(), Capacity::new(2, 100)).unwrap();
    lfu.admit(0, s(1)).unwrap();
    lfu.admit(1, s(1)).unwrap();
    assert!(hit(&lfu, 1));
    assert!(hit(&lfu, 1));
    assert!(hit(&lfu, 0));
    // 0 was used twice, 1 three times.
    assert!(lfu.admit(2, s(1)).unwrap());
    assert!(!lfu.contains(0) && lfu.contains(1) && lfu.contains(2));
    // 2 has frequency 1: it goes next, not 1.
    assert!(lfu.admit(3, s(1)).unwrap());
    assert!(!lfu.contains(2) && lfu.contains(1));
}

#[test]
fn static_fill_never_evicts() {
    let st = StaticCache::new(spec(), Capacity::new(2, 100)).unwrap();
    assert!(st.admit(0, s(1)).unwrap());
    assert!(st.admit(1, s(1)).unwrap());
    for id in 2..10 {
        assert!(!st.admit(id, s(1)).unwrap());
    }
    assert!(st.contains(0) && st.contains(1));
    assert!(hit(&st, 0));
    let stats = st.end_epoch(None).unwrap();
    assert_eq!(stats.evictions, 0);
}

#[test]
fn nocache_misses_everything() {
    let p = NoCache::new(spec(), Capacity::new(5, 100)).unwrap();
    p.begin_epoch(0).unwrap();
    assert!(!p.admit(0, s(1)).unwrap());
    assert_eq!(p.lookup(0, 0).unwrap(), Answer::Miss);
    assert_eq!(p.usage(), Capacity::default());
    let stats = p.end_epoch(None).unwrap();
    assert_eq!((stats.misses, stats.exact_hits), (1, 0));
}

#[test]
fn out_of_range_ids_are_errors() {
    let p = LruCache::new(spec(), Capacity::new(5, 100)).unwrap();
    assert!(p.lookup(10, 0).is_err());
    assert!(p.admit(10, s(1)).is_err());
}

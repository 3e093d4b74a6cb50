//! Which connections a server takes: a global cap, a share of it per client address (so that
//! one address holding idle connections cannot lock the others out), and a few slots kept for
//! health probes once the cap is reached (so that a liveness probe does not restart a node
//! under a flood).

use std::net::IpAddr;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::HttpLimits;
use crate::per_client::{ClientPermit, PerClientLimit};

/// Connections kept for health probes beyond `max_connections`, at most one per client
/// address; on them only `/healthz` and `/readyz` are answered.
pub const PROBE_CONNECTIONS: usize = 4;

/// What a connection may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Every request.
    Full,
    /// Health probes only: the connection took a slot kept for them because every other slot
    /// was taken.
    Probe,
}

/// Why a connection was closed unserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Its client address holds its share of the connections.
    ClientShare,
    /// Every slot is taken, the probes' too.
    Full,
}

/// The slots of one served connection; dropping it gives them back.
#[derive(Debug)]
pub(super) struct Admitted {
    pub(super) lane: Lane,
    _slot: OwnedSemaphorePermit,
    _client: ClientPermit,
    _probe_client: Option<ClientPermit>,
}

/// The connection slots of one listener.
#[derive(Debug)]
pub(super) struct Admission {
    all: Arc<Semaphore>,
    per_client: PerClientLimit,
    probes: Arc<Semaphore>,
    probes_per_client: PerClientLimit,
}

impl Admission {
    /// Slots for `limits`: `max_connections` (at least 1), a share of
    /// `max_connections_per_client` per address (no more than the cap; 0: the whole cap), and
    /// `probe_connections` for probes.
    pub(super) fn new(limits: &HttpLimits) -> Self {
        let max = limits.max_connections.max(1);
        let share = match limits.max_connections_per_client {
            0 => max,
            n => n.min(max),
        };
        Admission {
            all: Arc::new(Semaphore::new(max)),
            per_client: PerClientLimit::new(share),
            probes: Arc::new(Semaphore::new(limits.probe_connections)),
            probes_per_client: PerClientLimit::new(1),
        }
    }

    /// Takes the slots of a connection from `client`: a full one, else (every full slot
    /// taken) a probe's, else none.
    pub(super) fn admit(&self, client: IpAddr) -> Result<Admitted, Refusal> {
        let share = self
            .per_client
            .try_acquire(client)
            .ok_or(Refusal::ClientShare)?;
        if let Ok(slot) = self.all.clone().try_acquire_owned() {
            return Ok(Admitted {
                lane: Lane::Full,
                _slot: slot,
                _client: share,
                _probe_client: None,
            });
        }
        let probe_client = self
            .probes_per_client
            .try_acquire(client)
            .ok_or(Refusal::Full)?;
        let slot = self
            .probes
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::Full)?;
        Ok(Admitted {
            lane: Lane::Probe,
            _slot: slot,
            _client: share,
            _probe_client: Some(probe_client),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_client: usize, probes: usize) -> HttpLimits {
        HttpLimits {
            max_connections: max,
            max_connections_per_client: per_client,
            probe_connections: probes,
            ..HttpLimits::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_address_gets_its_share_and_the_others_the_rest() {
        let admission = Admission::new(&limits(4, 2, 0));
        let flood: Vec<_> = (0..2)
            .map(|_| admission.admit(ip("10.0.0.2")).unwrap())
            .collect();
        assert_eq!(
            admission.admit(ip("10.0.0.2")).unwrap_err(),
            Refusal::ClientShare
        );
        let other = admission.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(other.lane, Lane::Full);
        drop(flood);
        assert!(admission.admit(ip("10.0.0.2")).is_ok(), "slots come back");
    }

    #[test]
    fn past_the_cap_probes_get_a_kept_slot_one_per_address() {
        let admission = Admission::new(&limits(2, 1, 1));
        let _held = [
            admission.admit(ip("10.0.0.2")).unwrap(),
            admission.admit(ip("10.0.0.3")).unwrap(),
        ];
        let probe = admission.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(probe.lane, Lane::Probe);
        assert_eq!(admission.admit(ip("10.0.0.4")).unwrap_err(), Refusal::Full);
        drop(probe);
        assert_eq!(admission.admit(ip("10.0.0.4")).unwrap().lane, Lane::Probe);
    }

    #[test]
    fn a_share_of_0_or_over_the_cap_is_the_cap() {
        for share in [0, 10] {
            let admission = Admission::new(&limits(3, share, 0));
            let held: Vec<_> = (0..3)
                .map(|_| admission.admit(ip("10.0.0.2")).unwrap())
                .collect();
            assert_eq!(held.len(), 3);
            assert!(admission.admit(ip("10.0.0.2")).is_err());
        }
    }
}

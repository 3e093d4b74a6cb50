//! Console sessions: random ids in memory, each with its CSRF token, an expiry and the access
//! key it was signed in with (`None`: an open console, no keys configured). Bounded: when
//! full, expired sessions go first, then the one that would expire soonest.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The most sessions kept at once.
pub(crate) const MAX_SESSIONS: usize = 10_000;

/// One signed-in browser.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The access key signed in with; `None` on an open console.
    pub(crate) access_key: Option<String>,
    /// The token every state-changing form of this session carries.
    pub(crate) csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether `token` is this session's CSRF token (compared in constant time).
    pub(crate) fn csrf_ok(&self, token: &str) -> bool {
        ndpipe_util::http::constant_time_eq(token.as_bytes(), self.csrf.as_bytes())
    }
}

/// The sessions of one console.
pub(crate) struct Sessions {
    ttl: Duration,
    max: usize,
    by_id: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// Sessions lasting `ttl`, at most `max` at once.
    pub(crate) fn new(ttl: Duration, max: usize) -> Self {
        Sessions {
            ttl,
            max: max.max(1),
            by_id: Mutex::new(HashMap::new()),
        }
    }

    /// How long a session lasts.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A new session for `access_key`, and its id.
    pub(crate) fn create(
        &self,
        access_key: Option<String>,
    ) -> Result<(String, Session), getrandom::Error> {
        self.create_at(access_key, Instant::now())
    }

    fn create_at(
        &self,
        access_key: Option<String>,
        now: Instant,
    ) -> Result<(String, Session), getrandom::Error> {
        let id = random_token()?;
        let session = Session {
            access_key,
            csrf: random_token()?,
            expires: now + self.ttl,
        };
        let mut by_id = self.by_id.lock();
        if by_id.len() >= self.max {
            by_id.retain(|_, s| s.expires > now);
        }
        if by_id.len() >= self.max
            && let Some(oldest) = (by_id.iter())
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone())
        {
            by_id.remove(&oldest);
        }
        by_id.insert(id.clone(), session.clone());
        Ok((id, session))
    }

    /// The live session `id`; an expired one is forgotten.
    pub(crate) fn get(&self, id: &str) -> Option<Session> {
        self.get_at(id, Instant::now())
    }

    fn get_at(&self, id: &str, now: Instant) -> Option<Session> {
        let mut by_id = self.by_id.lock();
        match by_id.get(id) {
            Some(s) if s.expires > now => Some(s.clone()),
            Some(_) => {
                by_id.remove(id);
                None
            }
            None => None,
        }
    }

    /// Ends session `id`.
    pub(crate) fn remove(&self, id: &str) {
        self.by_id.lock().remove(id);
    }
}

/// 32 random bytes in hex.
fn random_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_expires_after_its_ttl() {
        let sessions = Sessions::new(Duration::from_secs(60), 10);
        let now = Instant::now();
        let (id, _) = sessions.create_at(Some("k".into()), now).unwrap();
        assert!(
            sessions
                .get_at(&id, now + Duration::from_secs(59))
                .is_some()
        );
        assert!(
            sessions
                .get_at(&id, now + Duration::from_secs(60))
                .is_none()
        );
        assert!(
            sessions.get_at(&id, now).is_none(),
            "an expired one is forgotten"
        );
    }

    #[test]
    fn sessions_are_bounded_and_the_soonest_to_expire_goes() {
        let sessions = Sessions::new(Duration::from_secs(60), 2);
        let now = Instant::now();
        let (first, _) = sessions.create_at(None, now).unwrap();
        let (second, _) = sessions
            .create_at(None, now + Duration::from_secs(1))
            .unwrap();
        let (third, _) = sessions
            .create_at(None, now + Duration::from_secs(2))
            .unwrap();
        assert!(sessions.get_at(&first, now).is_none());
        assert!(sessions.get_at(&second, now).is_some());
        assert!(sessions.get_at(&third, now).is_some());
        assert_eq!(sessions.by_id.lock().len(), 2);
    }

    #[test]
    fn csrf_tokens_are_per_session_and_checked() {
        let sessions = Sessions::new(Duration::from_secs(60), 10);
        let (a_id, a) = sessions.create(None).unwrap();
        let (_, b) = sessions.create(None).unwrap();
        assert_ne!(a.csrf, b.csrf);
        assert_eq!(a.csrf.len(), 64);
        assert!(a.csrf_ok(&a.csrf));
        assert!(!a.csrf_ok(&b.csrf));
        assert!(!a.csrf_ok(""));
        sessions.remove(&a_id);
        assert!(sessions.get(&a_id).is_none());
    }
}

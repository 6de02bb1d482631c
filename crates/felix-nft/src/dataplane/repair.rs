//! When to repair our tables after another program changed them: at once for a change that
//! comes alone, later and later while another program keeps changing them (a fight between two
//! writers must not become a busy loop of commits).
//!
//! A change that comes within [`FIGHT_WINDOW`] of the repair of the one before continues a
//! fight: its first [`FREE_REPAIRS`] changes are repaired at once (a person fixing things by
//! hand, a service restarting), then each waits twice as long as the last (from
//! [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`]); a quiet window ends the fight. The refresh interval
//! stays the backstop for anything the events miss.

use std::time::Duration;

use tokio::time::Instant;

/// Changes closer together than this are one fight.
pub const FIGHT_WINDOW: Duration = Duration::from_secs(10);
/// Changes of a fight repaired at once.
pub const FREE_REPAIRS: u32 = 3;
/// The delay of the first repair after those.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The back-off state.
#[derive(Debug, Default)]
pub struct RepairBackoff {
    /// When the last change's repair was due.
    last_repair: Option<Instant>,
    delay: Duration,
    /// Changes seen in the current fight (1 for a change that came alone).
    streak: u32,
}

/// What to do about one change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repair {
    /// How long to wait before the repair.
    pub delay: Duration,
    /// Changes in a row, each within the window of the last.
    pub streak: u32,
}

impl RepairBackoff {
    /// Another program changed our tables at `now`: when to repair.
    pub fn on_touch(&mut self, now: Instant) -> Repair {
        let in_fight = self
            .last_repair
            .is_some_and(|t| now.saturating_duration_since(t) < FIGHT_WINDOW);
        if in_fight {
            self.streak += 1;
            if self.streak > FREE_REPAIRS {
                self.delay = (self.delay * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF);
            }
        } else {
            self.streak = 1;
            self.delay = Duration::ZERO;
        }
        self.last_repair = Some(now + self.delay);
        Repair {
            delay: self.delay,
            streak: self.streak,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_change_is_repaired_at_once() {
        let mut b = RepairBackoff::default();
        let t = Instant::now();
        assert_eq!(b.on_touch(t).delay, Duration::ZERO);
        // Long after: alone again.
        let r = b.on_touch(t + FIGHT_WINDOW * 2);
        assert_eq!((r.delay, r.streak), (Duration::ZERO, 1));
    }

    #[test]
    fn a_fight_backs_off_doubling_up_to_the_cap() {
        let mut b = RepairBackoff::default();
        let mut t = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..12 {
            delays.push(b.on_touch(t).delay);
            t += Duration::from_millis(100);
        }
        let free = FREE_REPAIRS as usize;
        assert!(delays[..free].iter().all(|d| d.is_zero()), "{delays:?}");
        assert_eq!(delays[free], FIRST_BACKOFF);
        assert_eq!(delays[free + 1], FIRST_BACKOFF * 2);
        assert_eq!(*delays.last().unwrap(), MAX_BACKOFF);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        // The other writer answers each repair at once, however late it comes: still a fight.
        let r = b.on_touch(t + MAX_BACKOFF + Duration::from_secs(1));
        assert_eq!(r.delay, MAX_BACKOFF);
        t += MAX_BACKOFF * 2;
        // A quiet window ends the fight.
        let r = b.on_touch(t + MAX_BACKOFF + FIGHT_WINDOW);
        assert_eq!((r.delay, r.streak), (Duration::ZERO, 1));
    }
}

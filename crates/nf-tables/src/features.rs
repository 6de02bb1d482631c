//! What the running kernel's nf_tables offers and what its operations cost, decided once at
//! start: the kernel release, owned + persistent tables (probed), how a batch should name the
//! sets it creates, and whether every commit validates every table of the namespace.
//!
//! Only owner + persist is a capability a probe can see: the kernel refuses the flags it does
//! not know. The other two are costs of the kernel's code, not refusals — both encodings are
//! accepted everywhere — so they follow the release:
//! - Element lists of a set created in the same batch: before 6.12 the kernel finds a set given
//!   by batch ID alone by walking the whole transaction, once per element message; a name is
//!   found in the table's set list first. So before 6.12 we name the set and give its ID too, as
//!   `nft` does; from 6.12 the ID alone, which skips the name walk.
//! - Before 6.4 every commit validates every table of the namespace, so a small side table does
//!   not make an update's commit cheaper there (it still costs the later merge): it is off.
//!
//! A caller may override any decision by name ([`Features::set`]); which kernels it supports
//! and how its operators spell overrides are its own business.

use std::fmt;

/// A kernel release as `uname -r` prints it, with its numeric prefix parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRelease {
    /// `6` of `6.1.0-57-amd64`.
    pub major: u32,
    /// `1` of `6.1.0-57-amd64`.
    pub minor: u32,
    /// `0` of `6.1.0-57-amd64`; 0 when the release has no third number.
    pub patch: u32,
    /// The whole string (`6.1.0-57-amd64`).
    pub text: String,
}

impl KernelRelease {
    /// Parses `6.1.0-57-amd64`, `5.10.223`, `6.18.44-fc-v1252`: the leading `major.minor[.patch]`.
    pub fn parse(text: &str) -> Option<KernelRelease> {
        let mut nums = text
            .split(|c: char| !c.is_ascii_digit())
            .take(3)
            .map(|n| n.parse::<u32>().ok());
        let major = nums.next()??;
        let minor = nums.next()??;
        let patch = nums.next().flatten().unwrap_or(0);
        Some(KernelRelease {
            major,
            minor,
            patch,
            text: text.to_string(),
        })
    }

    /// The running kernel's release (`uname(2)`).
    pub fn current() -> Result<KernelRelease, String> {
        // SAFETY: `uname` fills the zeroed struct it is given; nothing else reads it meanwhile.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        if unsafe { libc::uname(&mut u) } != 0 {
            return Err(format!("uname: {}", std::io::Error::last_os_error()));
        }
        let bytes: Vec<u8> = u
            .release
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        KernelRelease::parse(&text).ok_or_else(|| format!("unreadable kernel release {text:?}"))
    }

    /// At least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl fmt::Display for KernelRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// How a decision was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The kernel was asked (a probe transaction).
    Probed,
    /// The release says so.
    Release,
    /// The caller said so ([`Features::set`]).
    Override,
}

impl Source {
    /// The name printed with a decision: `probed`, `release` or `override`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Probed => "probed",
            Source::Release => "release",
            Source::Override => "override",
        }
    }
}

/// One decision: its value and how it was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the feature is used.
    pub on: bool,
    /// How that was decided.
    pub source: Source,
}

/// The decisions, each with a name ([`Features::list`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Features {
    /// The running kernel's release, which most decisions follow.
    pub release: KernelRelease,
    /// Tables may carry `OWNER|PERSIST` (6.9+; probed).
    pub owner_persist_tables: Decision,
    /// Element lists name a set this batch creates by its ID alone (6.12+); otherwise by name
    /// and ID, as `nft` does.
    pub set_elements_by_id: Decision,
    /// Every commit validates every table of the namespace (before 6.4): no side table.
    pub every_table_validated: Decision,
}

/// Names of the decisions, as [`Features::set`] and [`Features::list`] spell them.
/// [`Features::owner_persist_tables`].
pub const OWNER_PERSIST_TABLES: &str = "OwnerPersistTables";
/// [`Features::set_elements_by_id`].
pub const SET_ELEMENTS_BY_ID: &str = "SetElementsByID";
/// [`Features::every_table_validated`].
pub const EVERY_TABLE_VALIDATED: &str = "EveryTableValidated";

impl Features {
    /// The decisions for `release`, with the probe's answer for owner + persist.
    pub fn decide(release: KernelRelease, owner_persist: bool) -> Features {
        let by_release = |on| Decision {
            on,
            source: Source::Release,
        };
        Features {
            owner_persist_tables: Decision {
                on: owner_persist,
                source: Source::Probed,
            },
            set_elements_by_id: by_release(release.at_least(6, 12)),
            every_table_validated: by_release(!release.at_least(6, 4)),
            release,
        }
    }

    /// Overrides the decision called `name` ([`OWNER_PERSIST_TABLES`], ...); false, and
    /// nothing changed, when no decision has that name.
    pub fn set(&mut self, name: &str, on: bool) -> bool {
        let slot = match name {
            OWNER_PERSIST_TABLES => &mut self.owner_persist_tables,
            SET_ELEMENTS_BY_ID => &mut self.set_elements_by_id,
            EVERY_TABLE_VALIDATED => &mut self.every_table_validated,
            _ => return false,
        };
        *slot = Decision {
            on,
            source: Source::Override,
        };
        true
    }

    /// Each decision with its name and what it means, for logs and metrics.
    pub fn list(&self) -> [(&'static str, Decision, &'static str); 3] {
        [
            (
                OWNER_PERSIST_TABLES,
                self.owner_persist_tables,
                "tables owned by the agent and kept across its restarts (6.9+)",
            ),
            (
                SET_ELEMENTS_BY_ID,
                self.set_elements_by_id,
                "a new set's elements name it by batch ID alone (6.12+; before, by name as nft does)",
            ),
            (
                EVERY_TABLE_VALIDATED,
                self.every_table_validated,
                "every commit validates every table (before 6.4): no side table",
            ),
        ]
    }
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kernel {}", self.release)?;
        for (name, d, what) in self.list() {
            writeln!(
                f,
                "  {name:<20} {:<5} ({}) {what}",
                if d.on { "yes" } else { "no" },
                d.source.as_str()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(s: &str) -> KernelRelease {
        KernelRelease::parse(s).unwrap()
    }

    #[test]
    fn releases_parse_from_what_distributions_print() {
        assert_eq!(
            (rel("6.1.0-57-amd64").major, rel("6.1.0-57-amd64").minor),
            (6, 1)
        );
        assert_eq!(rel("5.10.223").patch, 223);
        assert_eq!(rel("6.12.117+deb13-amd64").minor, 12);
        assert_eq!(rel("6.18.44-fc-v1252").patch, 44);
        assert_eq!(rel("6.9").patch, 0);
        assert!(KernelRelease::parse("linux").is_none());
        assert!(KernelRelease::parse("6").is_none());
    }

    #[test]
    fn decisions_follow_the_release() {
        let old = Features::decide(rel("5.10.0-32-amd64"), false);
        assert!(!old.set_elements_by_id.on && old.every_table_validated.on);
        let mid = Features::decide(rel("6.4.0"), false);
        assert!(!mid.set_elements_by_id.on && !mid.every_table_validated.on);
        let new = Features::decide(rel("6.12.117+deb13-amd64"), true);
        assert!(new.set_elements_by_id.on && !new.every_table_validated.on);
        assert_eq!(new.owner_persist_tables.source, Source::Probed);
    }

    #[test]
    fn a_decision_is_set_by_its_name() {
        let mut f = Features::decide(rel("6.18.44"), true);
        assert!(f.set(SET_ELEMENTS_BY_ID, false));
        assert!(!f.set_elements_by_id.on);
        assert_eq!(f.set_elements_by_id.source, Source::Override);
        let before = f.clone();
        assert!(!f.set("ChecksumOffloadBroken", true));
        assert_eq!(f, before, "an unknown name changes nothing");
    }
}

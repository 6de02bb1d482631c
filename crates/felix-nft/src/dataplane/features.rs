//! Which kernels felix-nft runs on, and Felix's `FeatureDetectOverride` applied to the
//! decisions `nf_tables` makes about the running kernel.

use nf_tables::features::{Features, KernelRelease};

/// The oldest kernel felix-nft supports: Debian 11's 5.10, the oldest Calico supports.
pub const MIN_RELEASE: (u32, u32) = (5, 10);

/// An error naming the release when it is older than [`MIN_RELEASE`].
pub fn check_supported(release: &KernelRelease) -> Result<(), String> {
    let (maj, min) = MIN_RELEASE;
    if release.at_least(maj, min) {
        Ok(())
    } else {
        Err(format!(
            "kernel {release} is older than {maj}.{min}, the oldest felix-nft supports (its nf_tables lacks what felix-nft relies on; Calico itself needs {maj}.{min})"
        ))
    }
}

/// Applies Felix's `FeatureDetectOverride` (`Name=true,Other=false,Third=`, comma-separated):
/// an empty value keeps the detected decision. Names felix-nft does not decide (Felix's
/// iptables features) are returned, to be reported once. A value that is not a bool is an
/// error naming the entry, and then nothing is applied.
pub fn apply_overrides(features: &mut Features, spec: &str) -> Result<Vec<String>, String> {
    let mut wanted = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, value) = entry
            .split_once('=')
            .ok_or_else(|| format!("FeatureDetectOverride entry {entry:?} is not Name=value"))?;
        let on = match value.trim().to_ascii_lowercase().as_str() {
            "" => None,
            "true" => Some(true),
            "false" => Some(false),
            _ => {
                return Err(format!(
                    "FeatureDetectOverride entry {entry:?}: {:?} is not true, false or empty",
                    value.trim()
                ))
            }
        };
        wanted.push((name.trim(), on));
    }
    let mut ignored = Vec::new();
    for (name, on) in wanted {
        let known = match on {
            Some(on) => features.set(name, on),
            // "Detect": keep the decision, but still tell a known name from an unknown one.
            None => features.list().iter().any(|(n, ..)| *n == name),
        };
        if !known {
            ignored.push(name.to_string());
        }
    }
    Ok(ignored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nf_tables::features::Source;

    fn rel(s: &str) -> KernelRelease {
        KernelRelease::parse(s).unwrap()
    }

    #[test]
    fn the_minimum_is_checked_with_a_clear_error() {
        assert!(check_supported(&rel("5.10.0-32-amd64")).is_ok());
        assert!(check_supported(&rel("6.18.44")).is_ok());
        let e = check_supported(&rel("5.4.0-150-generic")).unwrap_err();
        assert!(e.contains("5.4.0-150-generic") && e.contains("5.10"), "{e}");
    }

    #[test]
    fn overrides_set_named_decisions_and_report_the_rest() {
        let mut f = Features::decide(rel("6.18.44"), true);
        let ignored = apply_overrides(
            &mut f,
            "SetElementsByID=false, OwnerPersistTables=, ChecksumOffloadBroken=true",
        )
        .unwrap();
        assert_eq!(ignored, vec!["ChecksumOffloadBroken".to_string()]);
        assert!(!f.set_elements_by_id.on);
        assert_eq!(f.set_elements_by_id.source, Source::Override);
        assert!(f.owner_persist_tables.on, "empty = detect");
        assert_eq!(f.owner_persist_tables.source, Source::Probed);
        let before = f.clone();
        let e = apply_overrides(&mut f, "OwnerPersistTables=false,EveryTableValidated=maybe")
            .unwrap_err();
        assert!(e.contains("EveryTableValidated=maybe"), "{e}");
        assert_eq!(f, before, "a bad entry applies none");
        assert!(apply_overrides(&mut f, "nonsense").is_err());
    }
}

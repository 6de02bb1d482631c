//! One-shot commands over the same dataplane: `apply`, `plan`, `dump`, `cleanup`.

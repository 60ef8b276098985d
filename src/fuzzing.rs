//! The `device_ops` fuzz harness (device operations checked against a model).

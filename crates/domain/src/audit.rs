//! The audit ledger's pure rules (R-AUDIT-1, R-AUDIT-2, R-AUDIT-4): canonical rows, the HMAC chain, verification.

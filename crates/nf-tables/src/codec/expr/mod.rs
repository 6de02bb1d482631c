//! Encoding and decoding of the expressions of [`Expr`]. Attribute order follows libnftnl
//! (`src/expr/*.c`, `*_build`), so our bytes equal `nft --debug=mnl`'s; decoding accepts any order.
//! An expression whose attributes we do not fully model decodes to [`Expr::Other`], raw, so
//! nothing read back is silently changed.

mod decode;
mod encode;
mod numbers;
mod verdict;

pub use decode::decode_expr;
pub use encode::put_expr;
pub(super) use encode::put_expr_in;
pub(crate) use numbers::meta_key_num;
pub(crate) use verdict::{decode_verdict, put_verdict, verdict_code};

use crate::model::Expr;

/// The kernel name of an expression (`NFTA_EXPR_NAME`).
pub fn expr_name(e: &Expr) -> &str {
    match e {
        Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
        Expr::Payload { .. } | Expr::PayloadSet { .. } => "payload",
        Expr::Cmp { .. } => "cmp",
        Expr::Bitwise { .. } => "bitwise",
        Expr::Range { .. } => "range",
        Expr::Lookup { .. } => "lookup",
        Expr::ImmediateData { .. } | Expr::Verdict(_) => "immediate",
        Expr::Counter { .. } => "counter",
        Expr::Ct { .. } => "ct",
        Expr::Log { .. } => "log",
        Expr::Limit { .. } => "limit",
        Expr::Reject { .. } => "reject",
        Expr::Nat { .. } => "nat",
        Expr::Masq { .. } => "masq",
        Expr::Notrack => "notrack",
        Expr::Fib { .. } => "fib",
        Expr::Connlimit { .. } => "connlimit",
        Expr::Other { name, .. } => name,
    }
}

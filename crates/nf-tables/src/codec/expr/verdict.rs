//! Verdicts as register data: `NFTA_DATA_VERDICT { CODE, [CHAIN] }`, in immediates and in
//! verdict-map elements.

use crate::codec::attr::{Attr, MsgWriter};
use crate::codec::CodecError;
use crate::consts::*;
use crate::model::Verdict;

/// Verdict code (`NF_*`/`NFT_*`) and target chain.
pub(crate) fn verdict_code(v: &Verdict) -> (i32, Option<&str>) {
    match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Continue => (NFT_CONTINUE, None),
        Verdict::Break => (NFT_BREAK, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Other(n) => (*n, None),
    }
}

/// `ty { NFTA_DATA_VERDICT { CODE, [CHAIN] } }`.
pub(crate) fn put_verdict(w: &mut MsgWriter, ty: u16, v: &Verdict) {
    let (code, chain) = verdict_code(v);
    let outer = w.begin_nest(ty);
    let inner = w.begin_nest(NFTA_DATA_VERDICT);
    w.put_be32(NFTA_VERDICT_CODE, code as u32);
    if let Some(c) = chain {
        w.put_str(NFTA_VERDICT_CHAIN, c);
    }
    w.end_nest(inner);
    w.end_nest(outer);
}

/// Decodes `NFTA_DATA_VERDICT { CODE, [CHAIN] }` (the inner nest).
pub(crate) fn decode_verdict(a: &Attr<'_>) -> Result<Verdict, CodecError> {
    let mut code = None;
    let mut chain = None;
    for x in a.nested() {
        let x = x?;
        match x.ty {
            NFTA_VERDICT_CODE => code = Some(x.be32("verdict")? as i32),
            NFTA_VERDICT_CHAIN => chain = Some(x.str("verdict")?),
            _ => {}
        }
    }
    let code = code.ok_or(CodecError::Missing {
        what: "verdict",
        attr: NFTA_VERDICT_CODE,
    })?;
    Ok(match (code, chain) {
        (NF_ACCEPT, None) => Verdict::Accept,
        (NF_DROP, None) => Verdict::Drop,
        (NFT_CONTINUE, None) => Verdict::Continue,
        (NFT_BREAK, None) => Verdict::Break,
        (NFT_RETURN, None) => Verdict::Return,
        (NFT_JUMP, Some(c)) => Verdict::Jump(c),
        (NFT_GOTO, Some(c)) => Verdict::Goto(c),
        (n, _) => Verdict::Other(n),
    })
}

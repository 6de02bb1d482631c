//! nf_tables / nfnetlink uapi constants, spelled as in `linux/netfilter/nf_tables.h`,
//! `linux/netfilter/nfnetlink.h` and libnftnl's `udata.h`. Nothing else lives here.
#![allow(missing_docs)]

// linux/netfilter/nfnetlink.h
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub const NFNL_MSG_BATCH_END: u16 = 17;
pub const NFNL_BATCH_GENID: u16 = 1;
pub const NFNETLINK_V0: u8 = 0;

// linux/netlink.h: the framing shared with the rtnetlink code.
pub use netlink_wire::{
    NLA_F_NESTED, NLA_F_NET_BYTEORDER, NLA_TYPE_MASK, NLMSGERR_ATTR_MSG, NLMSGERR_ATTR_OFFS,
    NLMSG_DONE, NLMSG_ERROR, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_APPEND, NLM_F_CAPPED, NLM_F_CREATE,
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_ECHO, NLM_F_EXCL, NLM_F_MATCH, NLM_F_MULTI, NLM_F_REPLACE,
    NLM_F_REQUEST, NLM_F_ROOT,
};

// enum nf_tables_msg_types
pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_DELCHAIN: u16 = 5;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_DELSET: u16 = 11;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_DELSETELEM: u16 = 14;
pub const NFT_MSG_NEWGEN: u16 = 15;
pub const NFT_MSG_GETGEN: u16 = 16;

// enum nft_table_attributes
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_FLAGS: u16 = 2;
pub const NFTA_TABLE_USE: u16 = 3;
pub const NFTA_TABLE_HANDLE: u16 = 4;
pub const NFTA_TABLE_USERDATA: u16 = 6;
pub const NFTA_TABLE_OWNER: u16 = 7;

// enum nft_chain_attributes
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_HANDLE: u16 = 2;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_USE: u16 = 6;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_CHAIN_COUNTERS: u16 = 8;
pub const NFTA_CHAIN_FLAGS: u16 = 10;
// enum nft_hook_attributes
pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;

// enum nft_rule_attributes
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_HANDLE: u16 = 3;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_POSITION: u16 = 6;
pub const NFTA_RULE_USERDATA: u16 = 7;
pub const NFTA_LIST_ELEM: u16 = 1;
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;

// enum nft_set_attributes
pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_DATA_TYPE: u16 = 6;
pub const NFTA_SET_DATA_LEN: u16 = 7;
pub const NFTA_SET_POLICY: u16 = 8;
pub const NFTA_SET_DESC: u16 = 9;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFTA_SET_HANDLE: u16 = 16;
/// One expression every element of the set gets (a nest as a rule's expression list item).
pub const NFTA_SET_EXPR: u16 = 17;
/// Several such expressions, a list of `NFTA_LIST_ELEM` nests.
pub const NFTA_SET_EXPRESSIONS: u16 = 18;
pub const NFTA_SET_DESC_SIZE: u16 = 1;
pub const NFTA_SET_DESC_CONCAT: u16 = 2;
pub const NFTA_SET_FIELD_LEN: u16 = 1;
/// `NFT_DATA_VERDICT`: the data type of a verdict map.
pub const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

// enum nft_set_elem_list_attributes / nft_set_elem_attributes
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
/// An element's one expression (its counter, from the set's template).
pub const NFTA_SET_ELEM_EXPR: u16 = 7;
pub const NFTA_SET_ELEM_KEY_END: u16 = 10;
/// An element's several expressions, a list of `NFTA_LIST_ELEM` nests.
pub const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;

// enum nft_data_attributes / nft_verdict_attributes
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;

// enum nft_gen_attributes
pub const NFTA_GEN_ID: u16 = 1;

// Verdict codes (linux/netfilter.h NF_*, nf_tables.h NFT_*).
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_CONTINUE: i32 = -1;
pub const NFT_BREAK: i32 = -2;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;

// Expression attributes.
pub const NFTA_META_DREG: u16 = 1;
pub const NFTA_META_KEY: u16 = 2;
pub const NFTA_META_SREG: u16 = 3;
pub const NFTA_PAYLOAD_DREG: u16 = 1;
pub const NFTA_PAYLOAD_BASE: u16 = 2;
pub const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub const NFTA_PAYLOAD_LEN: u16 = 4;
pub const NFTA_PAYLOAD_SREG: u16 = 5;
pub const NFTA_PAYLOAD_CSUM_TYPE: u16 = 6;
pub const NFTA_PAYLOAD_CSUM_OFFSET: u16 = 7;
pub const NFTA_PAYLOAD_CSUM_FLAGS: u16 = 8;
pub const NFTA_CMP_SREG: u16 = 1;
pub const NFTA_CMP_OP: u16 = 2;
pub const NFTA_CMP_DATA: u16 = 3;
pub const NFTA_BITWISE_SREG: u16 = 1;
pub const NFTA_BITWISE_DREG: u16 = 2;
pub const NFTA_BITWISE_LEN: u16 = 3;
pub const NFTA_BITWISE_MASK: u16 = 4;
pub const NFTA_BITWISE_XOR: u16 = 5;
pub const NFTA_BITWISE_OP: u16 = 6;
/// `NFT_BITWISE_BOOL` (renamed `NFT_BITWISE_MASK_XOR` in 6.13): `(reg & mask) ^ xor`.
pub const NFT_BITWISE_BOOL: u32 = 0;
pub const NFTA_RANGE_SREG: u16 = 1;
pub const NFTA_RANGE_OP: u16 = 2;
pub const NFTA_RANGE_FROM_DATA: u16 = 3;
pub const NFTA_RANGE_TO_DATA: u16 = 4;
pub const NFTA_LOOKUP_SET: u16 = 1;
pub const NFTA_LOOKUP_SREG: u16 = 2;
pub const NFTA_LOOKUP_DREG: u16 = 3;
pub const NFTA_LOOKUP_SET_ID: u16 = 4;
pub const NFTA_LOOKUP_FLAGS: u16 = 5;
pub const NFT_LOOKUP_F_INV: u32 = 1;
pub const NFTA_IMMEDIATE_DREG: u16 = 1;
pub const NFTA_IMMEDIATE_DATA: u16 = 2;
pub const NFTA_COUNTER_BYTES: u16 = 1;
pub const NFTA_COUNTER_PACKETS: u16 = 2;
pub const NFTA_CT_DREG: u16 = 1;
pub const NFTA_CT_KEY: u16 = 2;
pub const NFTA_CT_DIRECTION: u16 = 3;
pub const NFTA_LOG_GROUP: u16 = 1;
pub const NFTA_LOG_PREFIX: u16 = 2;
pub const NFTA_LOG_SNAPLEN: u16 = 3;
pub const NFTA_LOG_QTHRESHOLD: u16 = 4;
pub const NFTA_LOG_LEVEL: u16 = 5;
pub const NFTA_LOG_FLAGS: u16 = 6;
pub const NFTA_LIMIT_RATE: u16 = 1;
pub const NFTA_LIMIT_UNIT: u16 = 2;
pub const NFTA_LIMIT_BURST: u16 = 3;
pub const NFTA_LIMIT_TYPE: u16 = 4;
pub const NFTA_LIMIT_FLAGS: u16 = 5;
pub const NFT_LIMIT_PKTS: u32 = 0;
pub const NFT_LIMIT_PKT_BYTES: u32 = 1;
pub const NFT_LIMIT_F_INV: u32 = 1;
pub const NFTA_REJECT_TYPE: u16 = 1;
pub const NFTA_REJECT_ICMP_CODE: u16 = 2;
pub const NFTA_NAT_TYPE: u16 = 1;
pub const NFTA_NAT_FAMILY: u16 = 2;
pub const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
pub const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub const NFTA_NAT_REG_PROTO_MAX: u16 = 6;
pub const NFTA_NAT_FLAGS: u16 = 7;
pub const NFTA_MASQ_FLAGS: u16 = 1;
pub const NFTA_MASQ_REG_PROTO_MIN: u16 = 2;
pub const NFTA_MASQ_REG_PROTO_MAX: u16 = 3;
pub const NFTA_FIB_DREG: u16 = 1;
pub const NFTA_FIB_RESULT: u16 = 2;
pub const NFTA_FIB_FLAGS: u16 = 3;
pub const NFTA_CONNLIMIT_COUNT: u16 = 1;
pub const NFTA_CONNLIMIT_FLAGS: u16 = 2;

// libnftnl udata.h: rule and set userdata TLV types.
pub const NFTNL_UDATA_RULE_COMMENT: u8 = 0;
pub const NFTNL_UDATA_SET_KEYBYTEORDER: u8 = 0;
pub const NFTNL_UDATA_SET_DATABYTEORDER: u8 = 1;
pub const NFTNL_UDATA_SET_KEY_TYPEOF: u8 = 3;
pub const NFTNL_UDATA_SET_DATA_INTERVAL: u8 = 6;
/// nftables' `enum byteorder`: values of the byte-order udata.
pub const BYTEORDER_INVALID: u32 = 0;
pub const BYTEORDER_HOST_ENDIAN: u32 = 1;
pub const BYTEORDER_BIG_ENDIAN: u32 = 2;
/// nftables' `TYPE_BITS`: a concatenated key type is `id1 << 6*(n-1) | ... | idn`.
pub const TYPE_BITS: u32 = 6;

/// Kernel cap on rule userdata (`NFT_USERDATA_MAXLEN`).
pub const NFT_USERDATA_MAXLEN: usize = 256;
/// Largest netlink attribute payload (`nla_len` is a u16).
pub const NLA_MAX_LEN: usize = 0xffff;
/// `ERESTART`: the batch's generation id is stale (another writer committed first).
pub const ERESTART: i32 = 85;

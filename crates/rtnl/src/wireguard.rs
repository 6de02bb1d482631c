//! WireGuard's generic-netlink family (`wireguard`, version 1): read a device (its keys, listen
//! port, fwmark and peers) and change it (private key, port, fwmark, peers added, updated,
//! removed), as `wg` does, with no `wg` binary. Knows WireGuard's wire, not who the peers are.
//!
//! The family's id is dynamic: it is resolved once per socket with `CTRL_CMD_GETFAMILY`; a
//! kernel without the module has no such family ([`RtnlError::is_unsupported`]). The messages
//! are `netlink-packet-wireguard`'s, sent on a plain blocking `NETLINK_GENERIC` socket made in
//! the target namespace (run calls on a blocking thread).
//!
//! Large changes are cut as the kernel needs them (`chunks`): one `WG_CMD_SET_DEVICE` carries
//! the device's own attributes and at most [`ALLOWED_IPS_PER_MESSAGE`] allowed IPs; a peer whose
//! list does not fit continues in the next message by its key alone, without
//! `REPLACE_ALLOWEDIPS` (which would drop what the earlier part added). A device read back comes
//! in several messages the same way; its peers are merged by key.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use netlink_packet_core::{Emitable, ParseableParametrized};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::GenlMessage;
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute,
    WireguardCmd, WireguardMessage, WireguardPeer, WireguardPeerAttribute, WireguardPeerFlags,
};
use netlink_sys::protocols::NETLINK_GENERIC;
use netlink_sys::{Socket, SocketAddr as NlAddr};

use super::handle::{read_dump, socket_in};
use super::{Result, RtnlError};
use crate::netns::NetNs;
use netlink_wire::{
    messages_with_seq, nl_request, nlmsg_errno, NLMSG_ERROR, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};

/// The generic-netlink controller's fixed family id.
const GENL_ID_CTRL: u16 = 0x10;
/// The most allowed IPs one `WG_CMD_SET_DEVICE` carries (as `wgctrl` cuts them).
pub const ALLOWED_IPS_PER_MESSAGE: usize = 256;

/// A WireGuard key (32 bytes).
pub type Key = [u8; 32];

/// A device as the kernel reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WgDevice {
    pub ifindex: u32,
    /// `None`: no key set (the kernel reports none, or zeros).
    pub private_key: Option<Key>,
    pub public_key: Option<Key>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub peers: Vec<WgPeer>,
}

/// A peer as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgPeer {
    pub public_key: Key,
    pub endpoint: Option<SocketAddr>,
    /// Seconds; 0 is off.
    pub keepalive: u16,
    pub allowed_ips: Vec<IpNet>,
    /// Seconds since the epoch of the last handshake (0: none yet).
    pub last_handshake: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// A change to one device: what is `Some` is set; the peers are changed as listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WgUpdate {
    pub private_key: Option<Key>,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    pub peers: Vec<PeerUpdate>,
}

/// A change to one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerUpdate {
    pub public_key: Key,
    /// Remove the peer (nothing else is sent for it).
    pub remove: bool,
    /// Change an existing peer only; never create one.
    pub update_only: bool,
    /// The peer's allowed IPs become `allowed_ips` (else they are added to its list).
    pub replace_allowed_ips: bool,
    pub endpoint: Option<SocketAddr>,
    pub keepalive: Option<u16>,
    pub allowed_ips: Vec<IpNet>,
}

impl PeerUpdate {
    /// A peer change that sets nothing yet.
    pub fn new(public_key: Key) -> PeerUpdate {
        PeerUpdate {
            public_key,
            remove: false,
            update_only: false,
            replace_allowed_ips: false,
            endpoint: None,
            keepalive: None,
            allowed_ips: Vec::new(),
        }
    }

    /// Removes the peer.
    pub fn remove(public_key: Key) -> PeerUpdate {
        PeerUpdate {
            remove: true,
            ..PeerUpdate::new(public_key)
        }
    }
}

/// A generic-netlink socket in one namespace with WireGuard's family resolved.
#[derive(Debug)]
pub struct WgSocket {
    sock: Socket,
    family: u16,
    seq: u32,
}

impl WgSocket {
    /// A socket in `ns` (the current namespace with `None`). Fails with an error for which
    /// [`RtnlError::is_unsupported`] holds when the kernel has no WireGuard.
    pub fn open(ns: Option<&NetNs>) -> Result<WgSocket> {
        let sock = socket_in(ns, NETLINK_GENERIC)?;
        let mut s = WgSocket {
            sock,
            family: 0,
            seq: 0,
        };
        s.family = s.resolve_family()?;
        Ok(s)
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn resolve_family(&mut self) -> Result<u16> {
        let seq = self.next_seq();
        let msg = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName("wireguard".into())],
        });
        let req = nl_request(GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK, seq, &[&emit(&msg)]);
        self.send(&req, "resolving the wireguard family")?;
        let mut family = None;
        loop {
            let buf = self.recv("resolving the wireguard family")?;
            for (ty, payload, mseq) in messages_with_seq(&buf) {
                if mseq != seq {
                    continue;
                }
                if ty == NLMSG_ERROR {
                    return match nlmsg_errno(payload) {
                        // No such family: the module is not loaded.
                        Some(errno) if errno == libc::ENOENT => Err(RtnlError::Unsupported {
                            op: "resolving the wireguard family",
                            what: "WireGuard (no wireguard module)",
                        }),
                        Some(errno) => Err(genl_error_on(
                            "resolving the generic-netlink family",
                            "wireguard",
                            errno,
                        )),
                        None => family.ok_or_else(|| RtnlError::Unexpected {
                            op: "resolving the wireguard family",
                            what: "no family id in the answer".into(),
                        }),
                    };
                }
                if ty == GENL_ID_CTRL {
                    let parsed =
                        GenlMessage::<GenlCtrl>::parse_with_param(payload, ty).map_err(|e| {
                            RtnlError::Unexpected {
                                op: "resolving the wireguard family",
                                what: e.to_string(),
                            }
                        })?;
                    family = parsed.payload.nlas.iter().find_map(|a| match a {
                        GenlCtrlAttrs::FamilyId(id) => Some(*id),
                        _ => None,
                    });
                }
            }
        }
    }

    /// The device `ifname` with its peers. Blocking.
    pub fn get_device(&mut self, ifname: &str) -> Result<WgDevice> {
        let seq = self.next_seq();
        let msg = self.message(WireguardMessage {
            cmd: WireguardCmd::GetDevice,
            attributes: vec![WireguardAttribute::IfName(ifname.to_string())],
        });
        let req = nl_request(self.family, NLM_F_REQUEST | NLM_F_DUMP, seq, &[&msg]);
        let mut parts = Vec::new();
        let mut bad = None;
        read_dump(&self.sock, &req, seq, self.family, |payload| {
            match GenlMessage::<WireguardMessage>::parse_with_param(payload, self.family) {
                Ok(m) => parts.push(m.payload),
                Err(e) => {
                    bad.get_or_insert(e.to_string());
                }
            }
        })
        .map_err(|source| io_error("reading WireGuard device", ifname, source))?;
        if let Some(what) = bad {
            return Err(RtnlError::Unexpected {
                op: "reading WireGuard device",
                what,
            });
        }
        Ok(merge(parts))
    }

    /// Applies `update` to the device `ifname`, in as many messages as it needs. Blocking.
    pub fn set_device(&mut self, ifname: &str, update: &WgUpdate) -> Result<()> {
        for attrs in chunks(ifname, update) {
            let seq = self.next_seq();
            let msg = self.message(WireguardMessage {
                cmd: WireguardCmd::SetDevice,
                attributes: attrs,
            });
            let req = nl_request(self.family, NLM_F_REQUEST | NLM_F_ACK, seq, &[&msg]);
            self.send(&req, "configuring WireGuard device")?;
            let errno = self.wait_ack(seq)?;
            if errno != 0 {
                return Err(genl_error_on("configuring WireGuard device", ifname, errno));
            }
        }
        Ok(())
    }

    fn message(&self, payload: WireguardMessage) -> Vec<u8> {
        let mut msg = GenlMessage::from_payload(payload);
        msg.set_resolved_family_id(self.family);
        emit(&msg)
    }

    fn send(&self, req: &[u8], op: &'static str) -> Result<()> {
        self.sock
            .send_to(req, &NlAddr::new(0, 0), 0)
            .map(|_| ())
            .map_err(|source| io_error(op, "wireguard", source))
    }

    fn recv(&self, op: &'static str) -> Result<Vec<u8>> {
        self.sock
            .recv_from_full()
            .map(|(buf, _)| buf)
            .map_err(|source| io_error(op, "wireguard", source))
    }

    fn wait_ack(&self, seq: u32) -> Result<i32> {
        loop {
            let buf = self.recv("configuring WireGuard device")?;
            for (ty, payload, mseq) in messages_with_seq(&buf) {
                if ty == NLMSG_ERROR && mseq == seq {
                    return Ok(nlmsg_errno(payload).unwrap_or(0));
                }
            }
        }
    }
}

fn emit<T: Emitable>(m: &T) -> Vec<u8> {
    let mut buf = vec![0u8; m.buffer_len()];
    m.emit(&mut buf);
    buf
}

fn genl_error_on(op: &'static str, object: &str, errno: i32) -> RtnlError {
    RtnlError::Genl {
        op,
        object: object.to_string(),
        source: std::io::Error::from_raw_os_error(errno),
    }
}

fn io_error(op: &'static str, object: &str, source: std::io::Error) -> RtnlError {
    RtnlError::Genl {
        op,
        object: object.to_string(),
        source,
    }
}

fn nonzero(k: Key) -> Option<Key> {
    (k != [0; 32]).then_some(k)
}

/// One device from the messages of its dump, peers merged by key.
fn merge(parts: Vec<WireguardMessage>) -> WgDevice {
    let mut d = WgDevice::default();
    for m in parts {
        for a in m.attributes {
            match a {
                WireguardAttribute::IfIndex(i) => d.ifindex = i,
                WireguardAttribute::PrivateKey(k) => d.private_key = nonzero(k),
                WireguardAttribute::PublicKey(k) => d.public_key = nonzero(k),
                WireguardAttribute::ListenPort(p) => d.listen_port = p,
                WireguardAttribute::Fwmark(f) => d.fwmark = f,
                WireguardAttribute::Peers(peers) => {
                    for p in peers {
                        add_peer(&mut d.peers, p);
                    }
                }
                _ => {}
            }
        }
    }
    d
}

fn add_peer(peers: &mut Vec<WgPeer>, p: WireguardPeer) {
    let Some(key) = p.0.iter().find_map(|a| match a {
        WireguardPeerAttribute::PublicKey(k) => Some(*k),
        _ => None,
    }) else {
        return;
    };
    let i = match peers.iter().position(|q| q.public_key == key) {
        Some(i) => i,
        None => {
            peers.push(WgPeer {
                public_key: key,
                endpoint: None,
                keepalive: 0,
                allowed_ips: Vec::new(),
                last_handshake: 0,
                rx_bytes: 0,
                tx_bytes: 0,
            });
            peers.len() - 1
        }
    };
    let peer = &mut peers[i];
    for a in p.0 {
        match a {
            WireguardPeerAttribute::Endpoint(e) => peer.endpoint = Some(e),
            WireguardPeerAttribute::PersistentKeepalive(k) => peer.keepalive = k,
            WireguardPeerAttribute::LastHandshake(t) => {
                peer.last_handshake = u64::try_from(t.seconds).unwrap_or(0);
            }
            WireguardPeerAttribute::RxBytes(b) => peer.rx_bytes = b,
            WireguardPeerAttribute::TxBytes(b) => peer.tx_bytes = b,
            WireguardPeerAttribute::AllowedIps(ips) => {
                peer.allowed_ips.extend(ips.iter().filter_map(allowed_ip));
            }
            _ => {}
        }
    }
}

fn allowed_ip(a: &WireguardAllowedIp) -> Option<IpNet> {
    let mut ip = None;
    let mut cidr = None;
    for attr in &a.0 {
        match attr {
            WireguardAllowedIpAttr::IpAddr(i) => ip = Some(*i),
            WireguardAllowedIpAttr::Cidr(c) => cidr = Some(*c),
            _ => {}
        }
    }
    IpNet::new(ip?, cidr?).ok()
}

fn allowed_ip_attr(n: &IpNet) -> WireguardAllowedIp {
    let family = match n.addr() {
        IpAddr::V4(_) => WireguardAddressFamily::Ipv4,
        IpAddr::V6(_) => WireguardAddressFamily::Ipv6,
    };
    WireguardAllowedIp(vec![
        WireguardAllowedIpAttr::Family(family),
        WireguardAllowedIpAttr::IpAddr(n.addr()),
        WireguardAllowedIpAttr::Cidr(n.prefix_len()),
    ])
}

/// The attributes of each `WG_CMD_SET_DEVICE` that `update` needs (module doc): the device's
/// own in the first, at most [`ALLOWED_IPS_PER_MESSAGE`] allowed IPs (and as many peers) in
/// each.
fn chunks(ifname: &str, update: &WgUpdate) -> Vec<Vec<WireguardAttribute>> {
    let mut first = vec![WireguardAttribute::IfName(ifname.to_string())];
    if let Some(k) = update.private_key {
        first.push(WireguardAttribute::PrivateKey(k));
    }
    if let Some(p) = update.listen_port {
        first.push(WireguardAttribute::ListenPort(p));
    }
    if let Some(f) = update.fwmark {
        first.push(WireguardAttribute::Fwmark(f));
    }
    let mut out: Vec<Vec<WireguardAttribute>> = Vec::new();
    let mut head = first;
    let mut peers: Vec<WireguardPeer> = Vec::new();
    let mut room = ALLOWED_IPS_PER_MESSAGE;
    let flush = |head: &mut Vec<WireguardAttribute>,
                 peers: &mut Vec<WireguardPeer>,
                 out: &mut Vec<Vec<WireguardAttribute>>| {
        let mut attrs =
            std::mem::replace(head, vec![WireguardAttribute::IfName(ifname.to_string())]);
        if !peers.is_empty() {
            attrs.push(WireguardAttribute::Peers(std::mem::take(peers)));
        }
        out.push(attrs);
    };
    for p in &update.peers {
        // Every peer takes room, so a message never holds more peers than allowed IPs.
        if room == 0 {
            flush(&mut head, &mut peers, &mut out);
            room = ALLOWED_IPS_PER_MESSAGE;
        }
        let key = WireguardPeerAttribute::PublicKey(p.public_key);
        if p.remove {
            peers.push(WireguardPeer(vec![
                key,
                WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe),
            ]));
            room -= 1;
            continue;
        }
        let mut flags = WireguardPeerFlags::empty();
        if p.update_only {
            flags |= WireguardPeerFlags::UpdateOnly;
        }
        if p.replace_allowed_ips {
            flags |= WireguardPeerFlags::ReplaceAllowedIps;
        }
        let mut attrs = vec![key.clone(), WireguardPeerAttribute::Flags(flags)];
        if let Some(e) = p.endpoint {
            attrs.push(WireguardPeerAttribute::Endpoint(e));
        }
        if let Some(k) = p.keepalive {
            attrs.push(WireguardPeerAttribute::PersistentKeepalive(k));
        }
        let mut ips = p.allowed_ips.iter();
        let take = room.max(1).min(p.allowed_ips.len());
        let part: Vec<_> = ips.by_ref().take(take).map(allowed_ip_attr).collect();
        room = room.saturating_sub(take.max(1));
        if !part.is_empty() || p.replace_allowed_ips {
            attrs.push(WireguardPeerAttribute::AllowedIps(part));
        }
        peers.push(WireguardPeer(attrs));
        // The rest of its list, by key alone, in the messages that follow.
        let rest: Vec<&IpNet> = ips.collect();
        for more in rest.chunks(ALLOWED_IPS_PER_MESSAGE) {
            flush(&mut head, &mut peers, &mut out);
            peers.push(WireguardPeer(vec![
                key.clone(),
                WireguardPeerAttribute::Flags(WireguardPeerFlags::UpdateOnly),
                WireguardPeerAttribute::AllowedIps(
                    more.iter().map(|n| allowed_ip_attr(n)).collect(),
                ),
            ]));
            room = ALLOWED_IPS_PER_MESSAGE - more.len();
        }
    }
    flush(&mut head, &mut peers, &mut out);
    out
}

/// Creates the device `name`: a link of kind `wireguard` with nothing but its name, as Felix
/// creates it (port, key and fwmark are set over generic netlink). A kernel without the module
/// refuses the kind: [`RtnlError::Unsupported`].
pub async fn create_device(h: &super::RtnlHandle, name: &str) -> Result<()> {
    let res = h
        .handle()
        .link()
        .add(rtnetlink::LinkWireguard::new(name).build())
        .execute()
        .await;
    match res.map_err(|e| RtnlError::kernel("creating WireGuard device", name, e)) {
        Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => Err(RtnlError::Unsupported {
            op: "creating WireGuard device",
            what: "WireGuard (no wireguard module)",
        }),
        other => other,
    }
}

/// A new private key: 32 random bytes from the kernel, clamped as Curve25519 wants them (the
/// kernel clamps what it is given too, so the key read back is the key set); the kernel derives
/// the public key.
pub fn generate_private_key() -> std::io::Result<Key> {
    let mut k = [0u8; 32];
    let mut filled = 0;
    while filled < k.len() {
        // SAFETY: writes at most `k.len() - filled` bytes into the rest of `k`.
        let n = unsafe { libc::getrandom(k[filled..].as_mut_ptr().cast(), k.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    k[0] &= 248;
    k[31] &= 127;
    k[31] |= 64;
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(i: usize) -> IpNet {
        IpNet::new(IpAddr::from([10, (i >> 8) as u8, i as u8, 0]), 24).unwrap()
    }

    fn peer_ips(attrs: &[WireguardAttribute]) -> Vec<(Key, WireguardPeerFlags, usize)> {
        attrs
            .iter()
            .filter_map(|a| match a {
                WireguardAttribute::Peers(p) => Some(p),
                _ => None,
            })
            .flatten()
            .map(|p| {
                let mut key = [0; 32];
                let mut flags = WireguardPeerFlags::empty();
                let mut n = 0;
                for a in &p.0 {
                    match a {
                        WireguardPeerAttribute::PublicKey(k) => key = *k,
                        WireguardPeerAttribute::Flags(f) => flags = *f,
                        WireguardPeerAttribute::AllowedIps(v) => n = v.len(),
                        _ => {}
                    }
                }
                (key, flags, n)
            })
            .collect()
    }

    #[test]
    fn a_long_allowed_ip_list_continues_by_key_without_replacing() {
        let mut big = PeerUpdate::new([1; 32]);
        big.replace_allowed_ips = true;
        big.allowed_ips = (0..600).map(net).collect();
        let mut small = PeerUpdate::new([2; 32]);
        small.allowed_ips = vec![net(1000)];
        let update = WgUpdate {
            private_key: Some([9; 32]),
            listen_port: Some(51820),
            fwmark: Some(0x200000),
            peers: vec![big, small, PeerUpdate::remove([3; 32])],
        };
        let msgs = chunks("wg0", &update);
        assert_eq!(msgs.len(), 3, "{msgs:#?}");
        // The device's own attributes go once, in the first message.
        let own = |m: &[WireguardAttribute]| {
            m.iter()
                .filter(|a| {
                    matches!(
                        a,
                        WireguardAttribute::PrivateKey(_)
                            | WireguardAttribute::ListenPort(_)
                            | WireguardAttribute::Fwmark(_)
                    )
                })
                .count()
        };
        assert_eq!(msgs.iter().map(|m| own(m)).collect::<Vec<_>>(), [3, 0, 0]);
        let replace = WireguardPeerFlags::ReplaceAllowedIps;
        let update_only = WireguardPeerFlags::UpdateOnly;
        assert_eq!(peer_ips(&msgs[0]), [([1; 32], replace, 256)]);
        assert_eq!(peer_ips(&msgs[1]), [([1; 32], update_only, 256)]);
        assert_eq!(
            peer_ips(&msgs[2]),
            [
                ([1; 32], update_only, 88),
                ([2; 32], WireguardPeerFlags::empty(), 1),
                ([3; 32], WireguardPeerFlags::RemoveMe, 0)
            ]
        );
        for m in &msgs {
            assert!(matches!(&m[0], WireguardAttribute::IfName(n) if n == "wg0"));
            let ips: usize = peer_ips(m).iter().map(|p| p.2).sum();
            assert!(ips <= ALLOWED_IPS_PER_MESSAGE, "{ips}");
        }
    }

    #[test]
    fn many_peers_spread_over_messages_and_nothing_is_lost() {
        let update = WgUpdate {
            peers: (0..700u16)
                .map(|i| {
                    let mut k = [0; 32];
                    k[..2].copy_from_slice(&i.to_be_bytes());
                    let mut p = PeerUpdate::new(k);
                    p.allowed_ips = vec![net(usize::from(i))];
                    p
                })
                .collect(),
            ..WgUpdate::default()
        };
        let msgs = chunks("wg0", &update);
        assert_eq!(msgs.len(), 3);
        let all: Vec<_> = msgs.iter().flat_map(|m| peer_ips(m)).collect();
        assert_eq!(all.len(), 700);
        assert!(all.iter().all(|p| p.2 == 1));
    }

    #[test]
    fn a_device_read_in_parts_merges_its_peers_by_key() {
        let ip = |i| allowed_ip_attr(&net(i));
        let part = |ips: Vec<WireguardAllowedIp>| WireguardMessage {
            cmd: WireguardCmd::GetDevice,
            attributes: vec![WireguardAttribute::Peers(vec![WireguardPeer(vec![
                WireguardPeerAttribute::PublicKey([7; 32]),
                WireguardPeerAttribute::AllowedIps(ips),
            ])])],
        };
        let mut first = part(vec![ip(1), ip(2)]);
        first.attributes.push(WireguardAttribute::ListenPort(51820));
        first
            .attributes
            .push(WireguardAttribute::PrivateKey([0; 32]));
        let d = merge(vec![first, part(vec![ip(3)])]);
        assert_eq!(d.listen_port, 51820);
        assert_eq!(d.private_key, None, "zeros: no key");
        assert_eq!(d.peers.len(), 1);
        assert_eq!(d.peers[0].allowed_ips, [net(1), net(2), net(3)]);
    }

    #[test]
    fn generated_keys_differ() {
        let a = generate_private_key().unwrap();
        let b = generate_private_key().unwrap();
        assert_ne!(a, b);
        assert_ne!(a, [0; 32]);
        // Clamped: what the kernel stores is what was set.
        assert_eq!((a[0] & 7, a[31] & 0xc0), (0, 0x40));
    }
}

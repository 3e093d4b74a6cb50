//! A private network for the partition harness: one network namespace per process (the Tuner,
//! each PipeStore, PostgreSQL), each joined by a veth pair to a bridge in the host namespace,
//! with an address of its own in `10.77.N.0/24`. The harness itself talks to every process
//! from the bridge's address (`.254`), which no cut touches.
//!
//! Cuts are nftables rules in the namespaces (table `inet ndpcut`, chains `input` and
//! `output`), so that packets are dropped silently, as a real partition drops them:
//! - [`Net::cut_both`]: packets between two hosts are dropped both ways;
//! - [`Net::cut_one_way`]: the connections `from` opens to `to` are cut (their packets are
//!   dropped on arrival at `to`, also those of connections already open), while the
//!   connections `to` opens to `from` still work.
//!
//! [`Net::heal`] flushes every rule. Names carry the harness's pid and a letter (`ndp{pid}{c}`),
//! so that runs side by side do not collide and a later run can remove what a killed run left.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, bail};

/// Where `ip netns exec` (and so every process of the cluster) is started from.
const IP: &str = "ip";
/// The nftables table of the cuts, in every namespace.
const TABLE: &str = "ndpcut";
/// The bridge's host number, the harness's address on the private network.
const HARNESS_HOST: u8 = 254;

/// Whether this machine can build the network: root, `ip` and `nft`; the reason when not.
pub fn unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok();
    if uid.is_none_or(|o| String::from_utf8_lossy(&o.stdout).trim() != "0") {
        return Some("network namespaces need root".into());
    }
    for (tool, arg) in [(IP, "-V"), ("nft", "--version")] {
        let ran = Command::new(tool)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !ran.is_ok_and(|s| s.success()) {
            return Some(format!(
                "`{tool}` is missing (Debian's iproute2 and nftables)"
            ));
        }
    }
    None
}

/// One namespace of the network.
pub(crate) struct Host {
    /// Its namespace.
    pub(crate) ns: String,
    /// Its address.
    pub(crate) addr: String,
}

/// The bridge and the namespaces; removed when dropped.
pub(crate) struct Net {
    bridge: String,
    /// The hosts, in the order of the roles given to [`Net::new`].
    pub(crate) hosts: Vec<Host>,
}

fn run(tool: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .with_context(|| format!("running {tool}"))?;
    if !out.status.success() {
        bail!(
            "{tool} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `nft` in namespace `ns`.
fn nft(ns: &str, rule: &str) -> Result<()> {
    let mut args = vec!["netns", "exec", ns, "nft"];
    args.extend(rule.split(' '));
    run(IP, &args).map(drop)
}

impl Net {
    /// A bridge and one namespace per role (such as "tuner", "ps-0", "postgres"), each with
    /// its address and an empty table of cuts. Removes first what dead runs left behind.
    pub(crate) fn new(roles: &[&str]) -> Result<Self> {
        remove_stale();
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let letter = (b'a' + (RUNS.fetch_add(1, Ordering::Relaxed) % 26) as u8) as char;
        let tag = format!("ndp{}{letter}", std::process::id());
        let subnet = free_subnet()?;
        let mut net = Net {
            bridge: format!("{tag}b"),
            hosts: Vec::new(),
        };
        run(IP, &["link", "add", &net.bridge, "type", "bridge"])?;
        let harness = format!("{subnet}.{HARNESS_HOST}/24");
        run(IP, &["addr", "add", &harness, "dev", &net.bridge])?;
        run(IP, &["link", "set", &net.bridge, "up"])?;
        for (i, role) in roles.iter().enumerate() {
            let (ns, addr) = (format!("{tag}-{role}"), format!("{subnet}.{}", i + 1));
            let veth = format!("{tag}v{i}");
            run(IP, &["netns", "add", &ns])?;
            net.hosts.push(Host {
                ns: ns.clone(),
                addr: addr.clone(),
            });
            let ns = ns.as_str();
            run(
                IP,
                &[
                    "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
                ],
            )?;
            run(IP, &["link", "set", &veth, "master", &net.bridge, "up"])?;
            let cidr = format!("{addr}/24");
            run(IP, &["-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
            run(IP, &["-n", ns, "link", "set", "eth0", "up"])?;
            run(IP, &["-n", ns, "link", "set", "lo", "up"])?;
            nft(ns, &format!("add table inet {TABLE}"))?;
            for hook in ["input", "output"] {
                let chain = format!(
                    "add chain inet {TABLE} {hook} {{ type filter hook {hook} priority 0 ; policy accept ; }}"
                );
                nft(ns, &chain)?;
            }
        }
        Ok(net)
    }

    /// The program and arguments that run `exe args` in host `i`'s namespace.
    pub(crate) fn exec_in(&self, i: usize, exe: &Path) -> (PathBuf, Vec<String>) {
        let prefix = ["netns", "exec", &self.hosts[i].ns];
        let mut args: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        args.push(exe.to_string_lossy().into_owned());
        (PathBuf::from(IP), args)
    }

    /// Drops every packet between hosts `a` and `b`, both ways.
    pub(crate) fn cut_both(&self, a: usize, b: usize) -> Result<()> {
        let (ns, peer) = (&self.hosts[a].ns, &self.hosts[b].addr);
        nft(
            ns,
            &format!("add rule inet {TABLE} input ip saddr {peer} drop"),
        )?;
        nft(
            ns,
            &format!("add rule inet {TABLE} output ip daddr {peer} drop"),
        )
    }

    /// Cuts the connections host `from` opens to host `to` (new and open ones); those `to`
    /// opens to `from` still work.
    pub(crate) fn cut_one_way(&self, from: usize, to: usize) -> Result<()> {
        let (ns, peer) = (&self.hosts[to].ns, &self.hosts[from].addr);
        nft(
            ns,
            &format!("add rule inet {TABLE} input ip saddr {peer} ct direction original drop"),
        )
    }

    /// Removes every cut.
    pub(crate) fn heal(&self) -> Result<()> {
        for host in &self.hosts {
            for chain in ["input", "output"] {
                nft(&host.ns, &format!("flush chain inet {TABLE} {chain}"))?;
            }
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for host in &self.hosts {
            kill_all_in(&host.ns);
            let _ = run(IP, &["netns", "del", &host.ns]);
        }
        let _ = run(IP, &["link", "del", &self.bridge]);
    }
}

/// A `10.77.N` prefix (as text) that no route of the host namespace covers yet.
fn free_subnet() -> Result<String> {
    let start = std::process::id() as usize;
    for k in 0..250 {
        let prefix = format!("10.77.{}", (start + k) % 250);
        if run(IP, &["route", "show", &format!("{prefix}.0/24")])?
            .trim()
            .is_empty()
        {
            return Ok(prefix);
        }
    }
    bail!("no free 10.77.N.0/24 for the private network")
}

/// SIGKILL to every process still in namespace `ns` (by their ids, which `ip` lists).
fn kill_all_in(ns: &str) {
    let Ok(pids) = run(IP, &["netns", "pids", ns]) else {
        return;
    };
    for pid in pids.split_whitespace() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
}

/// The pid in a name this module gave (`ndp{pid}{letter}...`), if it is one.
fn owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("ndp")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let letter = rest[digits.len()..].chars().next()?;
    if !letter.is_ascii_lowercase() {
        return None;
    }
    digits.parse().ok()
}

/// Removes the namespaces and links of runs whose process is gone.
fn remove_stale() {
    let dead =
        |name: &str| owner(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
    for line in run(IP, &["netns", "list"]).unwrap_or_default().lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if dead(name) {
            kill_all_in(name);
            let _ = run(IP, &["netns", "del", name]);
        }
    }
    for line in run(IP, &["-o", "link", "show"]).unwrap_or_default().lines() {
        let name = line.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        if dead(name) {
            let _ = run(IP, &["link", "del", name]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::owner;

    #[test]
    fn names_of_this_module_give_their_pid_and_others_none() {
        assert_eq!(owner("ndp4242a-tuner"), Some(4242));
        assert_eq!(owner("ndp17bv3"), Some(17));
        assert_eq!(owner("ndpb0"), None);
        assert_eq!(owner("eth0"), None);
        assert_eq!(owner("ndp12"), None);
    }
}

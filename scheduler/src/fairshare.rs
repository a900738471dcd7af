//! Fair share as Slurm's Fair Tree computes it (its default since 19.05), on usage that decays
//! with a half-life (`PriorityDecayHalfLife`).
//!
//! The tree is the accounting database's: accounts under `root`, each user association a leaf
//! under its account. A user with usage or a live job but no association (a cluster whose
//! database enforces nothing, or a job without `--account`) is a leaf under `root`, shares 1.
//! At each level a child's `LevelFS = S / U`: its shares over its siblings' (`NormShares`) over
//! its decayed usage over its siblings' (`EffectvUsage`); no usage is an infinite `LevelFS`.
//! The tree is walked depth-first, siblings by `LevelFS` from highest (ties by name), and the
//! user associations are ranked in that order: the first of `n` gets `n`, a user whose
//! `LevelFS` equals the sibling's before it shares that rank. Accounts whose `LevelFS` tie
//! are ranked as one, their children merged, and a tie carries into them (so with no usage
//! anywhere every user ranks first). A user's fair share factor is its rank over `n`.
//!
//! Every number is made with +, ·, / and rounding only (no `exp`, no `powf`), so every node
//! computes the same bits.

use std::collections::BTreeMap;

use proto::accounts::{Accounts, Usage, ROOT_ACCOUNT};

/// 2^-x for x ≥ 0, with +, ·, / only: halvings for the whole part, a series for the rest.
pub fn pow2_neg(x: f64) -> f64 {
    if !x.is_finite() || x <= 0.0 {
        return if x.is_nan() || x <= 0.0 { 1.0 } else { 0.0 };
    }
    let whole = x.floor();
    if whole >= 1100.0 {
        return 0.0;
    }
    // e^-y for y = frac · ln 2 < 0.7: 24 terms leave an error far below f64's precision.
    let y = (x - whole) * std::f64::consts::LN_2;
    let (mut term, mut sum) = (1.0f64, 1.0f64);
    for k in 1..=24u32 {
        term = term * -y / f64::from(k);
        sum += term;
    }
    for _ in 0..(whole as u32) {
        sum /= 2.0;
    }
    sum
}

/// `value`, last decayed at `at_ms`, decayed to `now_ms`; `half_life_ms` 0: no decay. A time
/// before `at_ms` (a leader whose clock is behind) decays nothing.
fn decayed(value: u64, at_ms: u64, now_ms: u64, half_life_ms: u64) -> f64 {
    let value = value as f64;
    if half_life_ms == 0 || now_ms <= at_ms {
        return value;
    }
    value * pow2_neg(now_ms.saturating_sub(at_ms) as f64 / half_life_ms as f64)
}

/// `usage` decayed to `now_ms`, in GPU-milliseconds.
pub fn decayed_gpu_ms(usage: &Usage, now_ms: u64, half_life_ms: u64) -> f64 {
    decayed(usage.gpu_ms, usage.at_ms, now_ms, half_life_ms)
}

/// `usage`'s wall-clock time decayed to `now_ms`, in milliseconds (`GrpWall`).
pub fn decayed_wall_ms(usage: &Usage, now_ms: u64, half_life_ms: u64) -> f64 {
    decayed(usage.wall_ms, usage.at_ms, now_ms, half_life_ms)
}

/// `usage` decayed to `now_ms` plus `add_gpu_ms` GPU-milliseconds and `add_wall_ms` of wall-clock
/// time, as the replicated state keeps it.
pub fn add_usage(usage: &Usage, add_gpu_ms: u64, add_wall_ms: u64, now_ms: u64, half_life_ms: u64) -> Usage {
    let gpu_ms = decayed_gpu_ms(usage, now_ms, half_life_ms).round() as u64;
    let wall_ms = decayed_wall_ms(usage, now_ms, half_life_ms).round() as u64;
    Usage { gpu_ms: gpu_ms.saturating_add(add_gpu_ms), wall_ms: wall_ms.saturating_add(add_wall_ms), at_ms: usage.at_ms.max(now_ms) }
}

/// One line of `sshare`: an account, or a user's association with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Share {
    pub account: String,
    pub user: Option<String>,
    /// Levels below root (root is 0).
    pub depth: u32,
    pub raw_shares: u32,
    /// Its shares over its siblings' (root: 1).
    pub norm_shares: f64,
    /// Decayed GPU-milliseconds (an account: everything under it).
    pub usage_gpu_ms: f64,
    /// Its usage over its siblings' (root: 1 once anything was used).
    pub effective_usage: f64,
    /// `norm_shares / effective_usage`; infinite without usage; `None` for root.
    pub level_fs: Option<f64>,
    /// Users only: rank over users, in (0, 1].
    pub fair_share: Option<f64>,
}

/// The fair share of every association: `rows` in `sshare`'s order (depth-first; at each
/// level users, then accounts, by name) and each user association's factor.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FairShares {
    pub rows: Vec<Share>,
    pub factors: BTreeMap<(String, String), f64>,
}

impl FairShares {
    /// The factor of `user` charged to `account` (`None`: root); 1 for one not in the tree.
    pub fn factor(&self, account: Option<&str>, user: &str) -> f64 {
        let account = account.unwrap_or(ROOT_ACCOUNT);
        self.factors
            .get(&(account.to_string(), user.to_string()))
            .or_else(|| self.factors.get(&(ROOT_ACCOUNT.to_string(), user.to_string())))
            .copied()
            .unwrap_or(1.0)
    }
}

struct TreeNode {
    account: String,
    user: Option<String>,
    shares: u32,
    usage: f64,
    children: Vec<usize>,
    norm_shares: f64,
    effective_usage: f64,
    level_fs: f64,
}

/// Fair Tree over `accounts`, with `usage` by (account, user) decayed to `now_ms`, plus
/// `running` (GPU-ms of running jobs not charged yet, counted as of now), and `live` the
/// (account, user) of live jobs (they get a place in the tree without usage).
pub fn fair_tree<'a>(
    accounts: &'a Accounts,
    usage: &'a BTreeMap<(String, String), Usage>,
    running: &BTreeMap<(String, String), u64>,
    live: impl IntoIterator<Item = (Option<&'a str>, &'a str)>,
    now_ms: u64,
    half_life_ms: u64,
) -> FairShares {
    let mut nodes = vec![TreeNode::new(ROOT_ACCOUNT, None, 1)];
    let mut index: BTreeMap<&str, usize> = BTreeMap::from([(ROOT_ACCOUNT, 0)]);
    // Accounts, parents first: those whose parent is placed, until none is left (a cycle or
    // a missing parent hangs under root).
    let mut left: Vec<&proto::accounts::Account> = accounts.accounts.values().filter(|a| a.name != ROOT_ACCOUNT).collect();
    while !left.is_empty() {
        let before = left.len();
        left.retain(|a| {
            let parent = a.parent.as_deref().unwrap_or(ROOT_ACCOUNT);
            let Some(&p) = index.get(parent) else { return true };
            let at = nodes.len();
            index.insert(a.name.as_str(), at);
            nodes[p].children.push(at);
            nodes.push(TreeNode::new(&a.name, None, a.shares.unwrap_or(1)));
            false
        });
        if left.len() == before {
            for a in left.drain(..) {
                let at = nodes.len();
                index.insert(a.name.as_str(), at);
                nodes[0].children.push(at);
                nodes.push(TreeNode::new(&a.name, None, a.shares.unwrap_or(1)));
            }
        }
    }
    // User associations: the database's, then any with usage or a live job.
    let mut leaves: BTreeMap<(String, String), u32> = BTreeMap::new();
    for user in accounts.users.values() {
        for (account, assoc) in &user.assocs {
            leaves.insert((account.clone(), user.name.clone()), assoc.shares.unwrap_or(1));
        }
    }
    // Borrowed first: a sweep has many live jobs of few users. Usage of wall-clock time alone
    // (`GrpWall`: a job without GPUs) makes no leaf: it is no fair-share usage.
    let mut others: std::collections::BTreeSet<(&str, &str)> = std::collections::BTreeSet::new();
    let used = usage.iter().filter(|(_, u)| u.gpu_ms > 0).map(|((a, u), _)| (Some(a.as_str()), u.as_str()));
    for (account, user) in used.chain(live) {
        others.insert((account.filter(|a| index.contains_key(a)).unwrap_or(ROOT_ACCOUNT), user));
    }
    for (account, user) in others {
        leaves.entry((account.to_string(), user.to_string())).or_insert(1);
    }
    for ((account, user), shares) in &leaves {
        let parent = index.get(account.as_str()).copied().unwrap_or(0);
        let key = (account.clone(), user.clone());
        let used =
            usage.get(&key).map_or(0.0, |u| decayed_gpu_ms(u, now_ms, half_life_ms)) + running.get(&key).map_or(0.0, |&ms| ms as f64);
        let at = nodes.len();
        nodes[parent].children.push(at);
        let mut node = TreeNode::new(account, Some(user), *shares);
        node.usage = used;
        nodes.push(node);
    }
    // Usage sums up: children come after their parents in `nodes`.
    for i in (1..nodes.len()).rev() {
        let sum: f64 = nodes[i].children.iter().map(|&c| nodes[c].usage).sum();
        nodes[i].usage += sum;
    }
    nodes[0].usage = nodes[0].children.iter().map(|&c| nodes[c].usage).sum();
    levels(&mut nodes);
    let users = leaves.len();
    let mut out = FairShares::default();
    let mut rank = Ranking { next: users, rank: users, users };
    rank_users(&nodes, nodes[0].children.clone(), false, &mut rank, &mut out.factors);
    rows(&nodes, 0, 0, &out.factors, &mut out.rows);
    out
}

impl TreeNode {
    fn new(account: &str, user: Option<&str>, shares: u32) -> TreeNode {
        TreeNode {
            account: account.to_string(),
            user: user.map(str::to_string),
            shares,
            usage: 0.0,
            children: Vec::new(),
            norm_shares: 1.0,
            effective_usage: 0.0,
            level_fs: f64::INFINITY,
        }
    }

    /// Name among its siblings: a user by its name, an account by its.
    fn name(&self) -> &str {
        self.user.as_deref().unwrap_or(&self.account)
    }
}

/// Each node's shares and usage among its siblings, and their ratio.
fn levels(nodes: &mut [TreeNode]) {
    nodes[0].effective_usage = if nodes[0].usage > 0.0 { 1.0 } else { 0.0 };
    for p in 0..nodes.len() {
        let children = nodes[p].children.clone();
        let shares: u64 = children.iter().map(|&c| u64::from(nodes[c].shares)).sum();
        let usage: f64 = children.iter().map(|&c| nodes[c].usage).sum();
        for c in children {
            let n = &mut nodes[c];
            n.norm_shares = if shares == 0 { 0.0 } else { f64::from(n.shares) / shares as f64 };
            n.effective_usage = if usage > 0.0 { n.usage / usage } else { 0.0 };
            n.level_fs = if n.effective_usage > 0.0 { n.norm_shares / n.effective_usage } else { f64::INFINITY };
            if n.shares == 0 {
                n.level_fs = 0.0;
            }
        }
    }
}

struct Ranking {
    /// The rank the next user gets unless it ties.
    next: usize,
    /// The rank given last.
    rank: usize,
    users: usize,
}

/// Ranks the users under `siblings` (children of one account, or of accounts that tied),
/// highest `LevelFS` first. Accounts that tie with each other are ranked as one: their
/// children merged. `tied` says the first of `siblings` ties with what was ranked just before
/// (an account group that tied with the sibling before it).
fn rank_users(
    nodes: &[TreeNode],
    mut siblings: Vec<usize>,
    tied: bool,
    ranking: &mut Ranking,
    factors: &mut BTreeMap<(String, String), f64>,
) {
    // Highest LevelFS first; ties by name, users before accounts.
    siblings.sort_by(|&a, &b| {
        let (a, b) = (&nodes[a], &nodes[b]);
        b.level_fs.total_cmp(&a.level_fs).then(a.user.is_none().cmp(&b.user.is_none())).then(a.name().cmp(b.name()))
    });
    let mut previous: Option<f64> = None;
    let mut i = 0;
    while i < siblings.len() {
        let node = &nodes[siblings[i]];
        let ties = match previous {
            Some(fs) => fs.total_cmp(&node.level_fs).is_eq(),
            None => tied,
        };
        previous = Some(node.level_fs);
        match &node.user {
            Some(user) => {
                if !ties {
                    ranking.rank = ranking.next;
                }
                ranking.next = ranking.next.saturating_sub(1);
                let factor = if ranking.users == 0 || node.shares == 0 { 0.0 } else { ranking.rank as f64 / ranking.users as f64 };
                factors.insert((node.account.clone(), user.clone()), factor);
                i += 1;
            }
            None => {
                // This account and the accounts after it with the same LevelFS, as one.
                let mut merged = node.children.clone();
                i += 1;
                while i < siblings.len()
                    && nodes[siblings[i]].user.is_none()
                    && nodes[siblings[i]].level_fs.total_cmp(&node.level_fs).is_eq()
                {
                    merged.extend_from_slice(&nodes[siblings[i]].children);
                    i += 1;
                }
                rank_users(nodes, merged, ties, ranking, factors);
            }
        }
    }
}

fn rows(nodes: &[TreeNode], at: usize, depth: u32, factors: &BTreeMap<(String, String), f64>, out: &mut Vec<Share>) {
    let node = &nodes[at];
    out.push(Share {
        account: node.account.clone(),
        user: node.user.clone(),
        depth,
        raw_shares: node.shares,
        norm_shares: node.norm_shares,
        usage_gpu_ms: node.usage,
        effective_usage: node.effective_usage,
        level_fs: (at != 0).then_some(node.level_fs),
        fair_share: node.user.as_ref().map(|u| factors.get(&(node.account.clone(), u.clone())).copied().unwrap_or(0.0)),
    });
    let mut children = node.children.clone();
    children.sort_by(|&a, &b| {
        let (a, b) = (&nodes[a], &nodes[b]);
        a.user.is_none().cmp(&b.user.is_none()).then(a.name().cmp(b.name()))
    });
    for c in children {
        rows(nodes, c, depth + 1, factors, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::accounts::{Account, Assoc, User};

    fn usage(gpu_s: u64) -> Usage {
        Usage { gpu_ms: gpu_s * 1000, ..Default::default() }
    }

    #[test]
    fn pow2_neg_matches_halvings_and_powf() {
        assert_eq!(pow2_neg(0.0), 1.0);
        assert_eq!(pow2_neg(1.0), 0.5);
        assert_eq!(pow2_neg(3.0), 0.125);
        for x in [0.1, 0.5, 0.999, 1.5, 7.25, 30.3] {
            let want = 2f64.powf(-x);
            assert!((pow2_neg(x) - want).abs() <= want * 1e-14, "2^-{x}: {} vs {want}", pow2_neg(x));
        }
        assert_eq!(pow2_neg(5000.0), 0.0);
        assert_eq!(pow2_neg(f64::INFINITY), 0.0);
        assert_eq!(pow2_neg(-1.0), 1.0);
    }

    #[test]
    fn usage_halves_every_half_life_and_a_clock_behind_decays_nothing() {
        let week_ms = 7 * 24 * 3_600_000;
        let u = Usage { gpu_ms: 1_000_000, wall_ms: 60_000, at_ms: 1_000 };
        assert_eq!(decayed_gpu_ms(&u, 1_000 + week_ms, week_ms), 500_000.0);
        assert_eq!(decayed_gpu_ms(&u, 1_000 + 2 * week_ms, week_ms), 250_000.0);
        assert_eq!(decayed_gpu_ms(&u, 500, week_ms), 1_000_000.0);
        assert_eq!(decayed_gpu_ms(&u, 1_000 + week_ms, 0), 1_000_000.0, "half-life 0: no decay");
        assert_eq!(decayed_wall_ms(&u, 1_000 + week_ms, week_ms), 30_000.0, "wall-clock time decays alike");
        let added = add_usage(&u, 10, 5, 1_000 + week_ms, week_ms);
        assert_eq!(added, Usage { gpu_ms: 500_010, wall_ms: 30_005, at_ms: 1_000 + week_ms });
        assert_eq!(add_usage(&added, 0, 0, 0, week_ms).at_ms, 1_000 + week_ms, "time never goes back");
    }

    #[test]
    fn without_associations_users_rank_by_decayed_usage() {
        let db = Accounts::default();
        let used = BTreeMap::from([
            (("root".to_string(), "alice".to_string()), usage(1000)),
            (("root".to_string(), "bob".to_string()), usage(10)),
        ]);
        let fs = fair_tree(&db, &used, &BTreeMap::new(), [(None, "carol")], 0, 0);
        assert_eq!(fs.factor(None, "carol"), 1.0, "no usage ranks first");
        assert!((fs.factor(None, "bob") - 2.0 / 3.0).abs() < 1e-12);
        assert!((fs.factor(None, "alice") - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(fs.factor(None, "dave"), 1.0, "unknown: 1");
        // alice's usage is older: after enough half-lives bob's recent use weighs more.
        let mut later = used.clone();
        later.insert(("root".into(), "bob".into()), Usage { gpu_ms: 10_000, wall_ms: 0, at_ms: 70 * 60_000 });
        let fs = fair_tree(&db, &later, &BTreeMap::new(), [], 70 * 60_000, 5 * 60_000);
        assert!(fs.factor(None, "alice") > fs.factor(None, "bob"), "{fs:?}");
        // Wall-clock time alone (`GrpWall`'s usage of a job without GPUs) is no fair-share usage:
        // no leaf, so nobody else's rank moves.
        let mut walled = used.clone();
        walled.insert(("root".into(), "erin".into()), Usage { wall_ms: 60_000, ..Default::default() });
        assert_eq!(fair_tree(&db, &walled, &BTreeMap::new(), [], 0, 0), fair_tree(&db, &used, &BTreeMap::new(), [], 0, 0));
    }

    #[test]
    fn accounts_rank_first_and_their_users_inside_them() {
        // root ── physics (shares 3) ── alice, bob
        //     └── bio (shares 1) ─────── carol
        let mut db = Accounts::default();
        for (name, shares) in [("physics", 3), ("bio", 1)] {
            db.accounts.insert(
                name.into(),
                Account { name: name.into(), parent: Some("root".into()), shares: Some(shares), ..Default::default() },
            );
        }
        for (user, account) in [("alice", "physics"), ("bob", "physics"), ("carol", "bio")] {
            db.users.insert(
                user.into(),
                User {
                    name: user.into(),
                    default_account: account.into(),
                    assocs: BTreeMap::from([(account.to_string(), Assoc::default())]),
                },
            );
        }
        // physics used as much as bio but holds 3 shares of 4: it is under-served.
        let used = BTreeMap::from([
            (("physics".to_string(), "alice".to_string()), usage(400)),
            (("physics".to_string(), "bob".to_string()), usage(100)),
            (("bio".to_string(), "carol".to_string()), usage(500)),
        ]);
        let fs = fair_tree(&db, &used, &BTreeMap::new(), [], 0, 0);
        assert_eq!(fs.factor(Some("physics"), "bob"), 1.0);
        assert!((fs.factor(Some("physics"), "alice") - 2.0 / 3.0).abs() < 1e-12);
        assert!((fs.factor(Some("bio"), "carol") - 1.0 / 3.0).abs() < 1e-12);
        let physics = fs.rows.iter().find(|r| r.account == "physics" && r.user.is_none()).expect("physics row");
        assert_eq!((physics.depth, physics.raw_shares, physics.norm_shares, physics.effective_usage), (1, 3, 0.75, 0.5));
        assert_eq!(physics.level_fs, Some(1.5));
        let order: Vec<String> =
            fs.rows.iter().map(|r| format!("{}{}", r.account, r.user.as_ref().map(|u| format!("/{u}")).unwrap_or_default())).collect();
        assert_eq!(order, ["root", "bio", "bio/carol", "physics", "physics/alice", "physics/bob"]);
        // Nobody used anything: every user ranks first, across accounts too.
        let fs = fair_tree(&db, &BTreeMap::new(), &BTreeMap::new(), [(None, "dave")], 0, 0);
        assert_eq!(fs.factors.len(), 4);
        assert!(fs.factors.values().all(|&f| f == 1.0), "{:?}", fs.factors);
        // With bio's shares up to 9, bio is the under-served one.
        db.accounts.get_mut("bio").expect("bio").shares = Some(9);
        let fs = fair_tree(&db, &used, &BTreeMap::new(), [], 0, 0);
        assert_eq!(fs.factor(Some("bio"), "carol"), 1.0);
    }
}

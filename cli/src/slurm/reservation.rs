//! `scontrol create|update|delete reservation` and `scontrol show reservation`, as Slurm 22.05
//! takes and prints them (checked against the peer in `../shared/peers/slurm`).

use proto::{AdminReservation, ClientRequest, NodeInfo, ReservationChanges, ReservationEdit};

use super::{hostlist, time, SlurmError};

const PROG: &str = "scontrol";

/// The flags Corral does what Slurm does with; others are refused by name.
const FLAGS: [&str; 2] = ["MAINT", "IGNORE_JOBS"];

/// Whether `args` (after the verb) are about a reservation: `reservation ...` (or `res`), or a
/// `ReservationName=` among them.
pub fn is_reservation(args: &[String]) -> bool {
    let word = args.first().is_some_and(|a| !a.contains('=') && "reservation".starts_with(&a.to_ascii_lowercase()) && a.len() >= 3);
    word || args.iter().any(|kv| kv.split_once('=').is_some_and(|(k, _)| k.eq_ignore_ascii_case("reservationname")))
}

/// Parses `create|update|delete reservation KEY=VALUE...` at `now_s`.
pub fn parse(verb: &str, args: &[String], now_s: i64) -> Result<ReservationEdit, SlurmError> {
    let args: Vec<&String> = args.iter().filter(|a| a.contains('=')).collect();
    let mut name = None;
    let mut c = ReservationChanges::default();
    let bad = |kv: &str| SlurmError::fatal(PROG, format!("Invalid input: {kv}"));
    let names = |v: &str| -> Vec<String> { v.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect() };
    for kv in args {
        let (k, v) = kv.split_once('=').ok_or_else(|| bad(kv))?;
        if k.ends_with(['+', '-']) {
            return Err(SlurmError::fatal(PROG, format!("{kv}: adding to or removing from a list is not supported; give the whole list")));
        }
        let point = || time::parse_point(v, now_s).map(|s| s.max(0) as u64 * 1000).ok_or_else(|| bad(kv));
        match k.to_ascii_lowercase().as_str() {
            "reservationname" | "reservation" => name = Some(v.to_string()),
            _ if verb == "delete" => return Err(bad(kv)),
            "starttime" => c.start_ms = Some(point()?),
            "endtime" => c.end_ms = Some(point()?),
            "duration" => match time::parse_limit_s(v) {
                Ok(Some(s)) => c.duration_ms = Some(s.saturating_mul(1000)),
                Ok(None) => return Err(SlurmError::fatal(PROG, "Duration=UNLIMITED is not supported: give an end (Duration or EndTime)")),
                Err(time::NotATime) => return Err(bad(kv)),
            },
            // `Nodes=ALL` (any case): every node, as Slurm's `ALL_NODES`.
            "nodes" if v.eq_ignore_ascii_case("all") => (c.nodes, c.all_nodes) = (None, true),
            "nodes" => (c.nodes, c.all_nodes) = (Some(hostlist::expand(v).map_err(|e| SlurmError::fatal(PROG, e))?), false),
            "nodecnt" | "nodecount" => c.node_count = Some(v.parse().map_err(|_| bad(kv))?),
            "users" | "user" => c.users = Some(names(v)),
            "accounts" | "account" => c.accounts = Some(names(v)),
            "flags" | "flag" => {
                for flag in v.split(',').filter(|f| !f.is_empty()) {
                    match flag.to_ascii_uppercase().as_str() {
                        "MAINT" => c.maint = Some(true),
                        "IGNORE_JOBS" => c.ignore_jobs = Some(true),
                        other => {
                            return Err(SlurmError::fatal(
                                PROG,
                                format!("Flags={other} is not supported: Corral has {}", FLAGS.join(" and ")),
                            ))
                        }
                    }
                }
            }
            _ => return Err(SlurmError::fatal(PROG, format!("{k} is not supported for reservations"))),
        }
    }
    match verb {
        "create" => Ok(ReservationEdit::Create { name, changes: c }),
        _ => {
            let name = name.filter(|n| !n.is_empty()).ok_or_else(|| SlurmError::fatal(PROG, "Reservation must be given."))?;
            Ok(if verb == "update" { ReservationEdit::Update { name, changes: c } } else { ReservationEdit::Delete { name } })
        }
    }
}

/// Sends one edit; Slurm's answer, or its message on refusal.
pub fn send(edit: ReservationEdit) -> Result<i32, SlurmError> {
    let verb = match &edit {
        ReservationEdit::Create { .. } => "creating",
        ReservationEdit::Update { .. } => "updating",
        ReservationEdit::Delete { .. } => "delete",
    };
    let deleting = match &edit {
        ReservationEdit::Delete { name } => Some(name.clone()),
        _ => None,
    };
    let cluster = super::connect(PROG)?;
    let reply = super::block_on(PROG, async { cluster.call_patiently(ClientRequest::EditReservation { edit }, super::PATIENCE).await })?;
    match reply {
        Ok(proto::Reply::ReservationMade { name }) => println!("Reservation created: {name}"),
        Ok(_) if deleting.is_none() => println!("Reservation updated."),
        Ok(_) => {}
        Err(e) => {
            let why = super::describe_error(&e);
            // Slurm's client says some refusals itself, before the controller.
            if why.ends_with("No reservation created.") {
                return Err(SlurmError::fatal(PROG, why));
            }
            let text = match deleting {
                Some(name) => format!("delete_reservation ReservationName={name}: {why}"),
                None => format!("Error {verb} the reservation: {why}"),
            };
            return Err(SlurmError { text, code: 1 });
        }
    }
    Ok(0)
}

/// `scontrol show reservation [NAME]`.
pub fn show(name: Option<&str>) -> Result<i32, SlurmError> {
    let cluster = super::connect(PROG)?;
    let (list, nodes) = super::block_on(PROG, async {
        let list = match cluster.call_patiently(ClientRequest::GetReservations, super::PATIENCE).await {
            Ok(proto::Reply::Reservations(l)) => l,
            Ok(other) => return Err(SlurmError::fatal(PROG, format!("unexpected reply {other:?}"))),
            Err(e) => return Err(SlurmError::fatal(PROG, super::describe_error(&e))),
        };
        Ok((list, super::list_nodes(PROG, &cluster).await?))
    })??;
    print!("{}", text(&list, &nodes, name, time::now_ms())?);
    Ok(0)
}

/// The reservations (`name`: that one) in Slurm's layout at `now_ms`.
pub fn text(list: &[AdminReservation], nodes: &[NodeInfo], name: Option<&str>, now_ms: u64) -> Result<String, SlurmError> {
    let shown: Vec<&AdminReservation> = list.iter().filter(|r| name.is_none_or(|n| r.name == n)).collect();
    if shown.is_empty() {
        return Err(SlurmError {
            text: match name {
                Some(n) => format!("Reservation {n} not found"),
                None => "No reservations in the system".into(),
            },
            code: 1,
        });
    }
    let list_or_null = |l: &[String]| if l.is_empty() { "(null)".to_string() } else { l.join(",") };
    let mut out = String::new();
    for r in shown {
        let cores: u32 = nodes.iter().filter(|n| r.nodes.contains(&n.name)).map(|n| n.cpus_total).sum();
        let duration = time::elapsed(r.end_ms.saturating_sub(r.start_ms) / 1000);
        out.push_str(&format!(
            "ReservationName={} StartTime={} EndTime={} Duration={duration}\n",
            r.name,
            time::datetime(r.start_ms),
            time::datetime(r.end_ms)
        ));
        let node_list = if r.nodes.is_empty() { "(null)".to_string() } else { hostlist::compress(&r.nodes) };
        out.push_str(&format!(
            "   Nodes={node_list} NodeCnt={} CoreCnt={cores} Features=(null) PartitionName=(null) Flags={}\n",
            r.nodes.len(),
            r.flags_text()
        ));
        out.push_str(&format!("   TRES=cpu={cores}\n"));
        out.push_str(&format!(
            "   Users={} Groups=(null) Accounts={} Licenses=(null) State={} BurstBuffer=(null) Watts=n/a\n",
            list_or_null(&r.users),
            list_or_null(&r.accounts),
            if r.active(now_ms) { "ACTIVE" } else { "INACTIVE" }
        ));
        out.push_str("   MaxStartDelay=(null)\n\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_what_operators_type_and_refuses_what_corral_lacks() {
        let now_s = 1_800_000_000;
        let create = parse(
            "create",
            &argv(&["reservation", "StartTime=now+1hour", "Duration=90", "Nodes=n[1-2]", "Users=root,alice", "Flags=MAINT"]),
            now_s,
        );
        let ReservationEdit::Create { name: None, changes } = create.expect("parses") else { panic!("a create without a name") };
        assert_eq!(changes.start_ms, Some((now_s as u64 + 3600) * 1000));
        assert_eq!((changes.duration_ms, changes.maint), (Some(90 * 60_000), Some(true)));
        assert_eq!(changes.nodes, Some(vec!["n1".to_string(), "n2".to_string()]));
        let all = parse("create", &argv(&["reservation", "StartTime=now", "Duration=60", "Nodes=all", "Users=root"]), now_s);
        let ReservationEdit::Create { changes, .. } = all.expect("parses") else { panic!("a create") };
        assert_eq!((changes.nodes, changes.all_nodes), (None, true), "Nodes=ALL, any case");
        let update = parse("update", &argv(&["ReservationName=m", "NodeCnt=3", "accounts=phys"]), now_s).expect("parses");
        assert!(matches!(update, ReservationEdit::Update { ref name, ref changes } if name == "m" && changes.node_count == Some(3)));
        assert_eq!(parse("delete", &argv(&["ReservationName=m"]), now_s), Ok(ReservationEdit::Delete { name: "m".into() }));
        let refused = |args: &[&str]| parse("create", &argv(args), now_s).unwrap_err().text;
        assert!(refused(&["reservation", "Flags=DAILY"]).contains("Flags=DAILY is not supported"));
        assert!(refused(&["reservation", "Users+=bob"]).contains("give the whole list"));
        assert!(refused(&["reservation", "Duration=UNLIMITED"]).contains("Duration=UNLIMITED is not supported"));
        assert!(refused(&["reservation", "Licenses=matlab:1"]).contains("Licenses is not supported for reservations"));
        assert!(is_reservation(&argv(&["res", "StartTime=now"])) && is_reservation(&argv(&["ReservationName=x"])));
        assert!(!is_reservation(&argv(&["PartitionName=x"])));
    }

    #[test]
    fn shows_a_reservation_as_slurm_22_05_does() {
        let r = AdminReservation {
            name: "root_1".into(),
            start_ms: 1_800_000_000_000,
            end_ms: 1_800_003_600_000,
            nodes: vec!["n1".into()],
            users: vec!["root".into()],
            maint: true,
            nodes_named: true,
            ..Default::default()
        };
        let shown = text(std::slice::from_ref(&r), &[], None, 0).expect("shown");
        let lines: Vec<&str> = shown.lines().collect();
        assert!(lines[0].starts_with("ReservationName=root_1 StartTime=") && lines[0].ends_with(" Duration=01:00:00"), "{shown}");
        assert_eq!(lines[1], "   Nodes=n1 NodeCnt=1 CoreCnt=0 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES");
        let all = AdminReservation { ignore_jobs: true, all_nodes: true, ..r.clone() };
        let shown = text(std::slice::from_ref(&all), &[], None, 0).expect("shown");
        assert!(shown.contains(" Flags=MAINT,IGNORE_JOBS,SPEC_NODES,ALL_NODES\n"), "as the peer shows Nodes=ALL: {shown}");
        assert_eq!(lines[3], "   Users=root Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a");
        assert_eq!(text(&[r], &[], Some("x"), 0).unwrap_err().text, "Reservation x not found");
        assert_eq!(text(&[], &[], None, 0).unwrap_err().text, "No reservations in the system");
    }
}

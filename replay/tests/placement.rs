//! FGD's placement on lists written here: a pod that allows several GPU models is placed only
//! on one of them, under Corral's scheduler and the Slurm model alike; MIG layouts re-carved
//! around running instances.

use replay::{cluster, placement, trace};

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
                     t4-node,32000,131072,2,T4\n\
                     v100-node,32000,131072,2,V100M32\n";

fn placed(pods: &str, policy: &str) -> usize {
    let nodes = cluster::openb_nodes(NODES, 1000, 1000).unwrap();
    let pods = trace::openb_pods(pods).unwrap();
    let report = placement::run(&pods, &nodes, 1000, replay::placement_policy(policy).unwrap(), policy, 42).unwrap();
    report.placed
}

#[test]
fn a_pod_allowing_several_models_is_placed_only_on_one_of_them() {
    // Two whole V100s among the pods' models: the third pod does not fit, though the T4s are free.
    let either = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
                  a,1000,1024,1,1000,V100M16|V100M32\n\
                  b,1000,1024,1,1000,V100M16|V100M32\n\
                  c,1000,1024,1,1000,V100M16|V100M32\n";
    // A share of a GPU of a model no node has: never placed.
    let none = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
                a,1000,1024,1,500,A100|P100\n";
    for policy in ["corral", "slurm-22.05"] {
        assert_eq!(placed(either, policy), 2, "{policy}");
        assert_eq!(placed(none, policy), 0, "{policy}");
    }
}

/// The MIG variant (`--mig`): a GPU running a 4g job takes a 3g job beside it, re-carved
/// around the held instance, so the other GPU stays whole for a whole-GPU job.
#[test]
fn a_mig_gpu_is_recarved_around_a_running_instance_and_the_idle_one_stays_whole() {
    let mut nodes = cluster::openb_nodes("sn,cpu_milli,memory_mib,gpu,model\nm1,32000,131072,2,A100\n", 1000, 1000).unwrap();
    for n in &mut nodes {
        n.mig_layouts = vec![Vec::new(); n.gpus as usize];
    }
    // 500 thousandths ask 4g.40gb (4/7 >= 0.5), 400 ask 3g.40gb, a whole GPU 7g.80gb.
    let pods = trace::openb_pods(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
         four,1000,1024,1,500,\n\
         three,1000,1024,1,400,\n\
         whole,1000,1024,1,1000,\n\
         more,1000,1024,1,1000,\n",
    )
    .unwrap();
    let report = placement::run(&pods, &nodes, 1000, replay::policy("corral").unwrap(), "corral", 42).unwrap();
    assert_eq!(report.placed, 3, "4g and 3g on one GPU, the whole one on the other, no room for a fourth");
    assert!((report.gpu_alloc_pct - 95.0).abs() < 1e-9, "(0.5 + 0.4 + 1) of 2 GPUs: {}", report.gpu_alloc_pct);
}

//! FGD's placement on lists written here: a pod that allows several GPU models is placed only
//! on one of them, under Corral's scheduler and the Slurm model alike.

use replay::{cluster, placement, trace};

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
                     t4-node,32000,131072,2,T4\n\
                     v100-node,32000,131072,2,V100M32\n";

fn placed(pods: &str, policy: &str) -> usize {
    let nodes = cluster::openb_nodes(NODES, 1000, 1000).unwrap();
    let pods = trace::openb_pods(pods).unwrap();
    let report = placement::run(&pods, &nodes, 1000, replay::policy(policy).unwrap(), policy, 42).unwrap();
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

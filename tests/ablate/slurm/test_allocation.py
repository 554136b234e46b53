"""The allocation read from a job's environment: SLURM's compressed host lists and per-node counts,
and every variable that does not parse refused with its name and value, before anything starts;
the job's ports apart from another job's; and a study whose cells do not fit a node refused."""

from __future__ import annotations

import pytest

from ablate.slurm.allocation import (
    Allocation,
    SlurmError,
    check_fits,
    expand_counts,
    expand_hostlist,
    gpus_from,
    read_allocation,
)
from ablate.slurm.ports import BLOCK, SLOTS, JobPorts, ports_taken, temp_dir
from ablate.study import parse_study

JOB = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu-a[01-02],n[7,9-10]",
    "SLURM_JOB_CPUS_PER_NODE": "16(x2),8(x3)",
    "SLURM_GPUS_PER_NODE": "h100:4",
    "SLURMD_NODENAME": "gpu-a01",
}


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("n1", ["n1"]),
        ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
        ("n[1-3,5],gpu-a[01-02]", ["n1", "n2", "n3", "n5", "gpu-a01", "gpu-a02"]),
        ("node[008-010]", ["node008", "node009", "node010"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a,b[1],c", ["a", "b1", "c"]),
    ],
)
def test_host_lists_expand_in_slurms_order(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["", "n[1-", "n1-3]", "n[a-b]", "n[3-1]", "n[[1]]", "a,,b", "a b"])
def test_a_host_list_that_does_not_parse_is_refused(text):
    with pytest.raises(ValueError):
        expand_hostlist(text)


def test_per_node_counts_and_gpus_expand():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("64") == [64]
    assert gpus_from("4") == 4 and gpus_from("a100:4") == 4 and gpus_from("a100:2,v100:1") == 3
    for bad in ("2(3)", "x", "2,(x2)"):
        with pytest.raises(ValueError):
            expand_counts(bad)


def test_the_allocation_is_read_from_the_jobs_environment():
    a = read_allocation(JOB)
    assert a.job_id == 4242 and a.head == "gpu-a01" and a.this_node == "gpu-a01"
    assert a.nodes == ("gpu-a01", "gpu-a02", "n7", "n9", "n10")
    assert a.cpus == (16, 16, 8, 8, 8) and a.gpus_per_node == 4 and a.restarts == 0
    salloc_shell = {k: v for k, v in JOB.items() if k != "SLURMD_NODENAME"}
    assert read_allocation({**salloc_shell, "SLURM_RESTART_COUNT": "2"}).this_node is None
    assert read_allocation({**salloc_shell, "SLURM_RESTART_COUNT": "2"}).restarts == 2


@pytest.mark.parametrize(
    "change, says",
    [
        ({"SLURM_JOB_ID": ""}, "not inside a SLURM allocation (SLURM_JOB_ID is not set)"),
        ({"SLURM_JOB_NODELIST": "gpu[01-"}, "SLURM_JOB_NODELIST='gpu[01-' does not parse"),
        ({"SLURM_JOB_CPUS_PER_NODE": "16(x2)"}, "gives 2 node(s), but SLURM_JOB_NODELIST"),
        ({"SLURM_JOB_CPUS_PER_NODE": "many"}, "SLURM_JOB_CPUS_PER_NODE='many' does not parse"),
        ({"SLURM_GPUS_PER_NODE": "h100:four"}, "SLURM_GPUS_PER_NODE='h100:four' does not parse"),
        ({"SLURMD_NODENAME": "login1"}, "SLURMD_NODENAME='login1' is not among the job's nodes"),
        ({"SLURM_JOB_NODELIST": "n1,n1", "SLURM_JOB_CPUS_PER_NODE": "2(x2)"}, "names a node twice"),
    ],
)
def test_what_does_not_parse_is_refused_naming_the_variable(change, says):
    with pytest.raises(SlurmError) as e:
        read_allocation({**JOB, **change})
    assert says in str(e.value)


def test_two_jobs_get_ports_and_folders_of_their_own():
    a, b = JobPorts(4242), JobPorts(4243)
    ports_a = set(a.named(head=True))
    assert not ports_a & set(b.named(head=True))
    assert len(ports_a) == BLOCK - 3  # the block less three spare ports
    assert max(ports_a) < 32768  # below Linux's ephemeral ports, where Ray's others are
    assert {a.gcs, a.client_server, a.dashboard, a.dashboard_agent, a.mlflow} <= ports_a
    assert JobPorts(4242 + SLOTS).base == a.base  # the one way two jobs share a block: refused
    assert temp_dir(4242, "n1") != temp_dir(4243, "n1") != temp_dir(4242, "n2")
    long = temp_dir(4242, "a-very-long-node-name.cluster.example.org")
    assert len(str(long)) < 40  # Ray's socket paths under it stay within 107 bytes


def test_a_port_in_use_is_named_with_its_holder():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        (line,) = ports_taken({port: "Ray's GCS", port + 1 if port < 65535 else port - 1: "x"})
    assert f"port {port} (for Ray's GCS) is taken by pid" in line


def _study(resources: str):
    raw = {
        "name": "fits",
        "base": {
            "model": {"preset": "tiny"},
            "train": {"steps": 2, "batch_size": 4, "seq_len": 16},
        },
        "grid": {"seed": [0]},
        "resources": resources,
    }
    return parse_study(raw, check_files=False)


def test_a_cell_larger_than_any_node_is_refused_naming_the_fields():
    alloc = Allocation(7, ("n1", "n2"), (4, 2), 0, "n1")
    check_fits(_study({"cpus": 4}), alloc)
    with pytest.raises(SlurmError) as e:
        check_fits(_study({"cpus": 8}), alloc)
    assert "resources: a cell asks for 8 CPU(s) and 0 GPU(s) per worker" in str(e.value)
    assert "job 7's nodes hold n1: 4 CPUs, n2: 2 CPUs" in str(e.value)
    with pytest.raises(SlurmError, match="asks for 1 CPU.s. and 1 GPU"):
        check_fits(_study({"cpus": 1, "gpus": 1}), alloc)
    with pytest.raises(SlurmError, match=r"resources.workers: 4 workers .* fit 3"):
        check_fits(_study({"cpus": 2, "workers": 4}), alloc)

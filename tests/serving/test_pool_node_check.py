"""``check_pool_nodes`` on the GCS node table's shape (``ray.nodes()``): which Ray nodes count as pool-node hosts
and what the error names when too few do. The end-to-end case (a real 2-node cluster, ``vertumnus serve`` with
``pool.nodes: 3``) is in test_multinode.py."""

from __future__ import annotations

from typing import Any

import pytest

from vertumnus.config import config_from_dict
from vertumnus.serving.hosting import check_pool_nodes

CFG = config_from_dict(
    {
        "pool": {"nodes": 2, "gpus_per_node": 2, "degrees": [1, 2], "initial_composition": "2xCP2"},
        "serving": {"cpu_slots": 4, "ray_node_resource": "vertumnus_pool_node"},
    }
)


def _node(i: int, alive: bool = True, **res: float) -> dict[str, Any]:
    return {"NodeID": f"{i:02d}" * 28, "Alive": alive, "Resources": res}


def test_enough_hosts_pass_and_head_dead_or_small_nodes_do_not_count() -> None:
    nodes = [_node(0, CPU=8), _node(1, CPU=2, vertumnus_pool_node=1), _node(2, CPU=4, vertumnus_pool_node=1)]
    check_pool_nodes(CFG, nodes, "CPU")  # two hosts with the unit and 2 slots each: fine
    with pytest.raises(ValueError) as err:
        check_pool_nodes(CFG, [nodes[0], nodes[1], _node(2, alive=False, CPU=2, vertumnus_pool_node=1)], "CPU")
    assert "needs 2 alive Ray nodes, each offering the resource 'vertumnus_pool_node'" in str(err.value)
    assert "the cluster has 1. Start the missing 1 with" in str(err.value)
    with pytest.raises(ValueError) as err:
        check_pool_nodes(CFG, [nodes[1], _node(3, CPU=1, vertumnus_pool_node=1)], "CPU")
    assert "the cluster has 1; with too few CPU slots: 030303030303 (1 CPU)" in str(err.value)
    assert """--num-cpus 2 --resources '{"vertumnus_pool_node": 1}'""" in str(err.value)

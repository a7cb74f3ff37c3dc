"""Tests for multigpu.zero.ledger: each rank holds what the paper's formulas say."""

from multigpu import costmodel, zero
from multigpu.collectives import ring_chunk_sizes
from multigpu.costmodel import ZERO_STAGES
from multigpu.ranks import zero as zero_ranks
from tests.zero.problem import CONFIG, STEPS, TIMEOUT, model_and_data


def test_each_rank_holds_only_its_chunks(trained):
    world_size, model, results, ddp, reference = trained
    numels = zero.layer_numels(model)  # [352, 1056, 165]
    total, bytes_each = sum(numels), 8  # float64
    for rank in range(world_size):
        flat_chunk = ring_chunk_sizes(total, world_size)[rank] * bytes_each
        layer_chunks = sum(
            ring_chunk_sizes(numel, world_size)[rank] for numel in numels
        )
        whole = total * bytes_each
        ledgers = {stage: results[stage][rank].ledger for stage in ZERO_STAGES}
        assert ledgers["DDP"] == {
            "parameters": whole,
            "gradients": whole,
            "optimizer": 2 * whole,
            "gathered": 0,
        }
        assert ledgers["ZeRO-1"] == {
            "parameters": whole,
            "gradients": whole,
            "optimizer": 2 * flat_chunk,
            "gathered": 0,
        }
        assert ledgers["ZeRO-2"] == {
            "parameters": whole,
            "gradients": flat_chunk,
            "optimizer": 2 * flat_chunk,
            "gathered": 0,
        }
        chunks = layer_chunks * bytes_each
        assert ledgers["ZeRO-3"] == {
            "parameters": chunks,
            "gradients": chunks,
            "optimizer": 2 * chunks,
            "gathered": max(numels) * bytes_each,  # one layer at a time
        }


def test_sharded_memory_adds_up_to_one_copy(trained):
    # Over all ranks the shards of ZeRO-3 hold exactly one copy of everything.
    world_size, model, results, ddp, reference = trained
    ledgers = [result.ledger for result in results["ZeRO-3"]]
    one_copy = results["DDP"][0].ledger
    for category in ("parameters", "gradients", "optimizer"):
        assert sum(ledger[category] for ledger in ledgers) == one_copy[category]


def test_ledger_and_traffic_equal_the_paper_when_shards_are_equal():
    # (4, 4, 4): two layers of 20 parameters, which 4 ranks split evenly.
    model, X, y = model_and_data(sizes=(4, 4, 4))
    model, X = model.float(), X.float()
    results = zero_ranks.compare_stages(model, X, y, CONFIG, 4, timeout=TIMEOUT)
    for stage in ZERO_STAGES:
        formula = costmodel.zero_memory_ledger(stage, 4, num_parameters=40)
        sent = costmodel.zero_bytes_sent_theory(stage, nbytes=40 * 4, world_size=4)
        for result in results[stage]:
            measured = dict(result.ledger, gathered=0)  # the paper ignores it
            assert measured == formula
            assert result.bytes_sent == [sent] * STEPS

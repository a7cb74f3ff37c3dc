"""hvd.CALL_MAP: each Horovod call next to what PyTorch writes instead."""

from multigpu import horovod_api as hvd


def test_call_map_is_a_table_with_one_row_per_horovod_call():
    columns = {"horovod", "torch.distributed", "here"}
    assert all(set(row) == columns for row in hvd.CALL_MAP)
    assert all(all(row.values()) for row in hvd.CALL_MAP)  # no empty cell
    calls = [row["horovod"] for row in hvd.CALL_MAP]
    assert len(set(calls)) == len(calls)

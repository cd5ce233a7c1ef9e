"""Each device fact has one home: an NPU's usable columns are stated in ``iron.devices`` and
every other reader (the npu target's resources, its transcription of mlir-aie's target model)
takes them from there."""

import pytest

from iron.devices import DEVICE_NAMES, device
from iron.targets.npu.preconditions import target_model
from iron.targets.npu.resources import NPUS, resources

NPU_NAMES = [n for n in DEVICE_NAMES if device(n).kind == "npu"]


def test_the_npus_are_the_same_in_the_devices_and_the_npu_target():
    assert sorted(NPU_NAMES) == sorted(NPUS) == ["npu1", "npu2"]


@pytest.mark.parametrize("name", NPU_NAMES)
def test_every_reader_of_an_npu_column_count_agrees_with_the_devices(name):
    columns = device(name).columns
    assert resources(name).columns == columns
    assert target_model(name).columns == columns


def test_the_column_counts_are_mlir_aies():
    """mlir-aie's ``getTargetModel(AIEDevice)`` (lib/Dialect/AIE/IR/AIEDialect.cpp): ``npu1``
    is ``VirtualizedNPU1TargetModel(4)``, ``npu2`` is ``NPU2TargetModel`` (8 columns), and
    ``npuN_Mcol`` has M; the last is parsed, not stated."""
    assert (device("npu1").columns, device("npu2").columns) == (4, 8)
    assert target_model("npu1_2col").columns == 2 and target_model("npu2_6col").columns == 6

"""GGUF files before llama.cpp reads them: each header checked (llama.cpp may crash on a truncated or
foreign file instead of failing), and an export's set found (its text models and its one projector,
whose widths must agree). Used by export, smoke and the card."""

from __future__ import annotations

import math
import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf

from vgrpo.config import QUANTIZATIONS, VgrpoError

TEXT_ARCHITECTURE = "qwen3vl"  # general.architecture of Qwen3-VL's text GGUF
PROJECTOR_ARCHITECTURE = "clip"  # ... of every llama.cpp mmproj
FILE_TYPES = {0: "f32", 1: "f16", 32: "bf16", **{ftype: name for name, ftype in QUANTIZATIONS.items()}}
UNQUANTIZED = ("f32", "f16", "bf16")

class GGUFError(VgrpoError):
    """A GGUF file that is missing, truncated, foreign, or that llama.cpp cannot load."""


# --- Headers ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    file_type: str  # "f16", "q4_k_m", ... from general.file_type
    width: int  # text: embedding length; projector: the text width it projects to
    tensor_types: dict[str, int]  # ggml type name -> number of tensors
    layers: int | None = None  # text: block count (what n_gpu_layers counts)


def read_gguf(path: Path, projector: bool = False) -> GGUFInfo:
    """Check a GGUF's header and tensor table before llama.cpp reads the file: llama.cpp may crash on a
    truncated or foreign file instead of failing."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: file not found")
    with path.open("rb") as f:
        magic = f.read(4)
        if magic != b"GGUF":
            raise GGUFError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                fields, tensor_types = _read_header(data)
        except (ValueError, struct.error) as err:
            raise GGUFError(f"{path}: truncated or corrupt GGUF ({err})") from None
    architecture = fields.get("general.architecture")
    expected = PROJECTOR_ARCHITECTURE if projector else TEXT_ARCHITECTURE
    if architecture != expected:
        role = "vision projector (mmproj)" if projector else "Qwen3-VL text model"
        raise GGUFError(f"{path}: not a {role}: general.architecture is {architecture!r}, expected {expected!r}")
    width_key = "clip.vision.projection_dim" if projector else f"{architecture}.embedding_length"
    if width_key not in fields:
        raise GGUFError(f"{path}: header lacks {width_key}")
    file_type = fields.get("general.file_type")
    layers = None if projector else fields.get(f"{architecture}.block_count")
    return GGUFInfo(path=path, architecture=architecture, file_type=FILE_TYPES.get(file_type, f"ftype{file_type}"),
                    width=int(fields[width_key]), tensor_types=dict(Counter(tensor_types).most_common()),
                    layers=None if layers is None else int(layers))


# GGUF value type -> struct format. Arrays hold one of these or strings.
_SCALARS = {gguf.GGUFValueType.UINT8: "B", gguf.GGUFValueType.INT8: "b", gguf.GGUFValueType.UINT16: "H",
            gguf.GGUFValueType.INT16: "h", gguf.GGUFValueType.UINT32: "I", gguf.GGUFValueType.INT32: "i",
            gguf.GGUFValueType.FLOAT32: "f", gguf.GGUFValueType.BOOL: "?", gguf.GGUFValueType.UINT64: "Q",
            gguf.GGUFValueType.INT64: "q", gguf.GGUFValueType.FLOAT64: "d"}


def _read_header(data) -> tuple[dict, list[str]]:
    """The scalar metadata and every tensor's type, after checking that each tensor's data lies inside
    the file. gguf.GGUFReader does the same but builds a numpy view per vocabulary entry: ~10 s for a
    Qwen GGUF (450k entries) on this project's CPU. This walks the same layout, with the `gguf`
    package's type tables, and skips arrays by their lengths."""
    offset = 0

    def take(fmt: str):
        nonlocal offset
        value = struct.unpack_from("<" + fmt, data, offset)[0]
        offset += struct.calcsize("<" + fmt)
        return value

    def text() -> str:
        nonlocal offset
        length = take("Q")
        if offset + length > len(data):
            raise ValueError(f"a string runs past the end of the file at byte {offset}")
        offset += length
        return bytes(data[offset - length:offset]).decode("utf-8", errors="replace")

    def value(kind: int):
        nonlocal offset
        kind = gguf.GGUFValueType(kind)
        if kind == gguf.GGUFValueType.STRING:
            return text()
        if kind == gguf.GGUFValueType.ARRAY:  # not needed here: skipped
            item, count = gguf.GGUFValueType(take("I")), take("Q")
            if item in _SCALARS:
                offset += count * struct.calcsize(_SCALARS[item])
            else:
                for _ in range(count):
                    value(item)
            return None
        return take(_SCALARS[kind])

    take("I")  # magic, checked by the caller
    version = take("I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (expected 2 or 3)")
    tensor_count, field_count = take("Q"), take("Q")
    fields = {}
    for _ in range(field_count):
        key = text()
        fields[key] = value(take("I"))
    tensors = []
    for _ in range(tensor_count):
        name, dims = text(), take("I")
        shape = [take("Q") for _ in range(dims)]
        kind, start = gguf.GGMLQuantizationType(take("I")), take("Q")
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        tensors.append((name, kind.name, start, math.prod(shape) // block * block_bytes))
    alignment = fields.get("general.alignment") or gguf.GGUF_DEFAULT_ALIGNMENT
    data_start = -(-offset // alignment) * alignment
    for name, _, start, size in tensors:
        if data_start + start + size > len(data):
            raise ValueError(f"tensor {name} ends at byte {data_start + start + size}, the file has {len(data)}")
    return fields, [kind for _, kind, _, _ in tensors]


def find_gguf_files(gguf_dir: Path) -> tuple[list[GGUFInfo], GGUFInfo]:
    """The text GGUFs of an export and its one projector (`mmproj-*.gguf`), headers checked, the
    projector's output width matched against each text model's width."""
    gguf_dir = Path(gguf_dir)
    if not gguf_dir.is_dir():
        raise GGUFError(f"{gguf_dir}: no GGUF directory (run the export stage: dvc repro export)")
    projectors = sorted(gguf_dir.glob("mmproj-*.gguf"))
    texts = sorted(p for p in gguf_dir.glob("*.gguf") if p not in projectors)
    if len(projectors) != 1:
        raise GGUFError(f"{gguf_dir}: expected one mmproj-*.gguf, found {len(projectors)}")
    if not texts:
        raise GGUFError(f"{gguf_dir}: no text model .gguf")
    projector = read_gguf(projectors[0], projector=True)
    infos = [read_gguf(path) for path in texts]
    for info in infos:
        if info.width != projector.width:
            raise GGUFError(f"{projector.path}: projects to width {projector.width}, but {info.path.name} has "
                            f"embedding length {info.width}: the projector belongs to another model")
    return infos, projector


def k_quant_share(tensor_types: dict[str, int]) -> float | None:
    """Of the quantized tensors, the share in K-quants (Q2_K..Q6_K); llama.cpp falls back to legacy
    types (q5_0, q8_0...) for rows whose length is not a multiple of 256. None when nothing is quantized."""
    quantized = {name: n for name, n in tensor_types.items() if name not in ("F32", "F16", "BF16")}
    total = sum(quantized.values())
    return round(sum(n for name, n in quantized.items() if name.endswith("_K")) / total, 4) if total else None

"""The llama.cpp side of the export: read a GGUF's header before llama.cpp touches the file, answer
image questions with llama-cpp-python (text GGUF + mmproj), and measure how closely those answers
follow the merged transformers model's on the same images. `run_smoke` is the `smoke` stage.

What is gated is what carries the task: the counts. Teacher-forced along the merged model's answer,
llama.cpp must choose the same digits where that answer states a count (`count_agreement`; the other,
template tokens are reported apart), give the first count the same distribution (`count_tv`), parse to
the same answers, and its counts must move with the image as much as the merged model's do (a blank
image in its place: `image_sensitivity`). Before any of that, the merged model must answer the smoke
images as `evaluate` answered them with base + adapter: the file shipped is the model evaluated.
"""

from __future__ import annotations

import ctypes
import gc
import io
import json
import math
import mmap
import struct
import sys
import time
import weakref
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gguf
import llama_cpp
import llama_cpp.llama_cpp as llama_cpp_lib
import llama_cpp.mtmd_cpp as mtmd_cpp
import numpy as np
import torch
from llama_cpp.llama_chat_format import MTMDChatHandler

from vgrpo import memory, models
from vgrpo.config import QUANTIZATIONS, Config, SmokeParams, VgrpoError
from vgrpo.files import write_json, write_jsonl
from vgrpo.prompts import hf_messages, llama_cpp_messages, parse_answer

TEXT_ARCHITECTURE = "qwen3vl"  # general.architecture of Qwen3-VL's text GGUF
PROJECTOR_ARCHITECTURE = "clip"  # ... of every llama.cpp mmproj
FILE_TYPES = {0: "f32", 1: "f16", 32: "bf16", **{ftype: name for name, ftype in QUANTIZATIONS.items()}}
UNQUANTIZED = ("f32", "f16", "bf16")
# Log-probs are compared where the reference gives a token p > 1e-3, not in the tail: a bf16 or 4-bit
# reference against an f16 file differs most on unlikely tokens (README: the smoke reference's precision).
MIN_REFERENCE_P = 1e-3
LLAMA_CPP_RESERVE = 1.0e9  # GPU bytes llama.cpp needs beside the layers it offloads: KV cache, compute buffers
_GGML_LOG_LEVEL_ERROR = 3


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


# --- llama.cpp ----------------------------------------------------------------------------------

@llama_cpp.llama_log_callback
def _errors_only(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level == _GGML_LOG_LEVEL_ERROR:
        sys.stderr.write(text.decode("utf-8", errors="replace"))


def quiet_llama_cpp() -> None:
    """llama.cpp, its quantizer and mtmd log every tensor and image slice to stderr; keep errors only."""
    llama_cpp.llama_log_set(_errors_only, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_log_set(_errors_only, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(_errors_only, ctypes.c_void_p(0))


def gpu_layers(text: GGUFInfo, projector: GGUFInfo, params: SmokeParams) -> int:
    """How many of the text model's layers llama.cpp puts on the GPU: smoke.n_gpu_layers, or for `auto`
    all of them (-1) when the file fits the GPU's free memory beside the projector and LLAMA_CPP_RESERVE,
    else the share of layers that fits (a 16 GB f16 8B on a T4), and 0 without a GPU or a CUDA build
    of llama.cpp."""
    if params.n_gpu_layers != "auto":
        return params.n_gpu_layers
    if not torch.cuda.is_available() or not llama_cpp.llama_supports_gpu_offload():
        return 0
    free = torch.cuda.mem_get_info()[0] - projector.path.stat().st_size - LLAMA_CPP_RESERVE
    size = text.path.stat().st_size
    if size <= free:
        return -1
    return max(0, int((text.layers or 0) * free / size))


@contextmanager
def open_llama(text: GGUFInfo, projector: GGUFInfo, params: SmokeParams):
    """A llama-cpp-python model with its projector, closed on exit; yields it and the seconds both took to load."""
    quiet_llama_cpp()
    # Llama() has no argument for llama_model_params.use_extra_bufts (llama.cpp's --no-repack) and builds
    # its params from llama_model_default_params(), so hand it defaults with the field set. Repacked and
    # AMX weights crash (SIGSEGV in ggml_backend_amx_mul_mat) in VMs that advertise AMX without enabling it.
    defaults = llama_cpp_lib.llama_model_default_params

    def model_params():
        model_params = defaults()
        model_params.use_extra_bufts = params.cpu_repack
        return model_params

    start = time.perf_counter()
    llama_cpp_lib.llama_model_default_params = model_params
    handler = MTMDChatHandler(clip_model_path=str(projector.path), verbose=False)
    try:
        llama = llama_cpp.Llama(
            model_path=str(text.path), chat_handler=handler, n_ctx=params.n_ctx, n_threads=params.n_threads,
            n_threads_batch=params.n_threads, verbose=False,
            n_gpu_layers=gpu_layers(text, projector, params),  # ignored by a llama.cpp built without a GPU
        )
    except ValueError as err:
        raise GGUFError(f"{text.path}: llama.cpp cannot load it ({err})") from None
    finally:
        llama_cpp_lib.llama_model_default_params = defaults
    try:
        try:
            handler._init_mtmd_context(llama)  # the projector loads lazily on the first image: load it now
        except ValueError as err:
            raise GGUFError(f"{projector.path}: llama.cpp cannot load the projector ({err})") from None
        yield llama, time.perf_counter() - start
    finally:
        llama.close()


@dataclass
class Answer:
    text: str
    token_ids: list[int]  # generated ids, the end-of-turn token included when the model stopped
    first_logprobs: np.ndarray  # log-probabilities of the first generated token, over the vocabulary
    seconds: float  # the whole request: image encoding, prompt, generation
    count_logprobs: np.ndarray | None = None  # log-probabilities where the answer states its first count
    blank_count_logprobs: np.ndarray | None = None  # the same, its prefix kept, with a blank image instead


@dataclass
class Forced:
    """llama.cpp following the reference answer token by token (teacher forcing)."""
    choices: list[int]  # its own greedy choice at each position of the reference answer
    count_logprobs: np.ndarray | None  # its log-probabilities at the reference's first count
    blank_count_logprobs: np.ndarray | None = None  # the same with a blank image: does the image move it?


def blank_image(image):
    """A white image of the same size: no shape to count."""
    from PIL import Image

    return Image.new("RGB", image.size, "white")


def llama_answer(llama, question: str, image, max_tokens: int) -> Answer:
    """Greedy answer from llama.cpp, with the ids it generated."""
    return _llama_chat(llama, question, image, max_tokens)


def llama_forced(llama, question: str, image, reference: list[int], count_at: int | None) -> Forced:
    """llama.cpp's greedy choice at each position of the reference answer while generation follows it,
    its log-probabilities at the reference's first count, and the same log-probabilities with a blank
    image (the prefix forced up to the count only)."""
    if not reference:
        return Forced([], None)
    answer = _llama_chat(llama, question, image, len(reference), forced=reference, capture_at=count_at)
    blank = None
    if count_at is not None:
        blank = _llama_chat(llama, question, blank_image(image), count_at + 1, forced=reference[:count_at + 1],
                            capture_at=count_at).count_logprobs
    return Forced(answer.token_ids, answer.count_logprobs, blank)


def _llama_chat(llama, question: str, image, max_tokens: int, forced: list[int] | None = None,
                capture_at: int | None = None) -> Answer:
    ids, first, captured = [], [], []

    def record(input_ids, scores):
        # Greedy takes the largest logit and repeat_penalty=1.0 leaves them unchanged, so the argmax
        # here is the token llama.cpp emits: its own ids, without a detokenize/retokenize round trip
        # (which would merge or split tokens of the random model's garbage).
        if not ids:
            first.append(_log_softmax(np.asarray(scores, dtype=np.float64)))
        if len(ids) == capture_at:
            captured.append(_log_softmax(np.asarray(scores, dtype=np.float64)))
        ids.append(int(np.argmax(scores)))
        if forced is not None:
            scores[:] = -np.inf
            scores[forced[len(ids) - 1]] = 0.0
        return scores

    start = time.perf_counter()
    try:
        result = llama.create_chat_completion(
            messages=llama_cpp_messages(question, image), temperature=0.0, repeat_penalty=1.0, seed=0,
            max_tokens=max_tokens, logits_processor=llama_cpp.LogitsProcessorList([record]))
    except ValueError as err:  # e.g. the image cannot be encoded, or the prompt exceeds n_ctx
        raise GGUFError(f"{llama.model_path}: llama.cpp cannot answer an image question ({err})") from None
    seconds = time.perf_counter() - start
    return Answer(result["choices"][0]["message"]["content"] or "", ids, first[0], seconds,
                  captured[0] if captured else None)


@torch.no_grad()
def hf_forced_logprobs(model, processor, question: str, image, prefix: list[int]) -> np.ndarray:
    """The next-token log-probabilities after the prompt (with `image`) and the answer tokens `prefix`."""
    from vgrpo.generation import append_tokens, batch_inputs

    inputs = batch_inputs(processor, [{"question": question, "image": image}], model.device)
    inputs = append_tokens(inputs, torch.tensor([prefix], device=model.device, dtype=inputs["input_ids"].dtype))
    return _log_softmax(model(**inputs, logits_to_keep=1).logits[0, -1].double().cpu().numpy())


@torch.no_grad()
def hf_answer(model, processor, question: str, image, max_new_tokens: int) -> Answer:
    """Greedy answer from transformers, with the same prompt and image-token budget, its log-probabilities
    where it states its first count, and the same with a blank image in place of the real one."""
    inputs = processor.apply_chat_template(hf_messages(question, image), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt").to(model.device)
    start = time.perf_counter()
    out = model.generate(**inputs, do_sample=False, repetition_penalty=1.0, max_new_tokens=max_new_tokens,
                         output_logits=True, return_dict_in_generate=True)
    seconds = time.perf_counter() - start
    ids = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    text = processor.tokenizer.decode(ids, skip_special_tokens=True)
    at = count_position(ids, processor.tokenizer)
    count = blank = None
    if at is not None:
        count = _log_softmax(out.logits[at][0].double().cpu().numpy())
        blank = hf_forced_logprobs(model, processor, question, blank_image(image), ids[:at])
    return Answer(text, ids, _log_softmax(out.logits[0][0].double().cpu().numpy()), seconds, count, blank)


def count_positions(ids: list[int], tokenizer) -> list[int]:
    """Where an answer states numbers (its digit tokens: the counts in its reasoning and its answer)."""
    return [i for i, token in enumerate(ids) if tokenizer.decode([token]).strip()[:1].isdigit()]


def count_position(ids: list[int], tokenizer) -> int | None:
    """The position of an answer's first digit: where the model says how many it sees."""
    return next(iter(count_positions(ids, tokenizer)), None)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def llama_image_embeddings(llama, image) -> np.ndarray:
    """What llama.cpp's projector (mmproj) hands the text model for `image`: one row per image token,
    the main features then each deepstack layer's, as mtmd computes them."""
    handler = llama.chat_handler
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    bitmap = handler._create_bitmap_from_bytes(buffer.getvalue())
    chunks = mtmd_cpp.mtmd_input_chunks_init()
    marker = mtmd_cpp.mtmd_default_marker()
    text = mtmd_cpp.mtmd_input_text()
    text.text, text.text_len, text.add_special, text.parse_special = marker, len(marker), False, True
    try:
        if mtmd_cpp.mtmd_tokenize(handler.mtmd_ctx, chunks, ctypes.byref(text),
                                  (mtmd_cpp.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) != 0:
            raise GGUFError(f"{llama.model_path}: mtmd cannot tokenize an image")
        for i in range(mtmd_cpp.mtmd_input_chunks_size(chunks)):
            chunk = mtmd_cpp.mtmd_input_chunks_get(chunks, i)
            if mtmd_cpp.mtmd_input_chunk_get_type(chunk) != mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                continue
            tokens = mtmd_cpp.mtmd_input_chunk_get_n_tokens(chunk)
            if mtmd_cpp.mtmd_encode_chunk(handler.mtmd_ctx, chunk) != 0:
                raise GGUFError(f"{llama.model_path}: the projector cannot encode an image")
            width = llama_cpp_lib.llama_model_n_embd_inp(llama.model)  # with deepstack: n_embd x (1 + layers)
            output = mtmd_cpp.mtmd_get_output_embd(handler.mtmd_ctx)
            return np.ctypeslib.as_array(output, shape=(tokens * width,)).reshape(tokens, width).astype(np.float64)
    finally:
        mtmd_cpp.mtmd_input_chunks_free(chunks)
        mtmd_cpp.mtmd_bitmap_free(bitmap)
    raise GGUFError(f"{llama.model_path}: mtmd produced no image chunk")


@torch.no_grad()
def hf_image_embeddings(model, processor, image) -> np.ndarray:
    """The same from the transformers model: its vision tower's merged features, then its deepstack
    features, one row per image token."""
    inputs = processor.image_processor(images=[image], return_tensors="pt").to(model.device)
    out = model.model.get_image_features(inputs["pixel_values"].to(model.dtype), inputs["image_grid_thw"])
    parts = [out.pooler_output[0], *(features[0] if isinstance(features, list | tuple) else features
                                     for features in out.deepstack_features)]
    return torch.cat(parts, dim=-1).double().cpu().numpy()


def projector_error(embeddings: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Largest relative L2 distance between llama.cpp's image embeddings and transformers', image by
    image: ~1e-4 for a faithful f16 projector, 1 for a zeroed one, ~1 or more for a noisy one. It tests
    the projector file itself, whether or not the language model has learned to use the image."""
    errors = [np.linalg.norm(e - r) / max(np.linalg.norm(r), 1e-12) if e.shape == r.shape else np.inf
              for e, r in zip(embeddings, reference, strict=True)]
    return float(max(errors))


# --- Runs and measures ----------------------------------------------------------------------------

@dataclass
class Run:
    """One model on the smoke images: its greedy answer to each image's own question, and for llama.cpp
    what it does when made to follow the reference's answer (teacher forcing)."""
    answers: list[Answer]
    load_seconds: float
    image_embeddings: list[np.ndarray]  # what the vision side hands the language model, per image
    forced: list[Forced] | None = None
    count_positions: list[list[int]] | None = None  # the reference's: where each answer states a number


def run_hf(merged_dir: Path, config: Config, dtype: str, samples: list[dict]) -> tuple[Run, dict]:
    """The merged model's answers, loaded as `train` loaded the base (dtype, 4-bit), straight onto the GPU
    when there is one; then the model is freed for real, so llama.cpp gets its GPU memory. Returns the run
    and what freeing gave back: the GPU's free memory with the model loaded and after (the driver's
    figures, torch.cuda.mem_get_info, after PyTorch's cache is emptied), or on a CPU the weights' bytes;
    and whether the model object is gone."""
    run, model_ref, free_loaded, weights = _merged_model_answers(merged_dir, config, dtype, samples)
    gc.collect()  # the model lived only in that call's frame; a cycle inside it needs the collector
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()  # PyTorch's caching allocator keeps freed blocks for itself until told
    free_after = torch.cuda.mem_get_info()[0] if cuda else None
    freed = (free_after - free_loaded) if cuda else weights
    return run, {"model_released": model_ref() is None, "memory_freed_gb": round(freed / 2**30, 3),
                 "gpu_free_gb_loaded": None if free_loaded is None else round(free_loaded / 2**30, 3),
                 "gpu_free_gb_after": None if free_after is None else round(free_after / 2**30, 3)}


def _merged_model_answers(merged_dir: Path, config: Config, dtype: str, samples: list[dict]):
    """The model exists only in this frame: no caller can keep it alive. Returns the run, a weak reference
    to the model, the GPU's free bytes while it is loaded (None on a CPU) and its weights' bytes."""
    start = time.perf_counter()
    processor = models.load_processor(str(merged_dir), config.model)
    model = models.load_model(str(merged_dir), dtype, load_in_4bit=config.train.load_in_4bit).eval()
    load_seconds = time.perf_counter() - start
    answers = [hf_answer(model, processor, s["question"], s["image"], config.smoke.max_new_tokens) for s in samples]
    models.check_finite(torch.from_numpy(answers[0].first_logprobs), dtype, f"smoke: the merged model ({merged_dir})")
    positions = [count_positions(a.token_ids, processor.tokenizer) for a in answers]
    embeddings = [hf_image_embeddings(model, processor, s["image"]) for s in samples]
    free_loaded = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return (Run(answers, load_seconds, embeddings, count_positions=positions), weakref.ref(model), free_loaded,
            weights)


def run_llama(text: GGUFInfo, projector: GGUFInfo, samples: list[dict], params: SmokeParams, reference: Run) -> Run:
    with open_llama(text, projector, params) as (llama, load_seconds):
        answers = [llama_answer(llama, s["question"], s["image"], params.max_new_tokens) for s in samples]
        forced = [llama_forced(llama, s["question"], s["image"], r.token_ids, next(iter(at), None))
                  for s, r, at in zip(samples, reference.answers, reference.count_positions, strict=True)]
        embeddings = [llama_image_embeddings(llama, s["image"]) for s in samples]
    return Run(answers, load_seconds, embeddings, forced)


def forced_agreement(run: Run, reference: Run) -> tuple[float | None, float | None]:
    """Share of the reference's tokens that llama.cpp also chose, each given the reference's own prefix:
    at the positions where the reference states a number (the counts), and at every other position (the
    template: tags, colour and shape words). None when there are no such positions. Teacher forcing, not
    free-running answers, so one near-tie cannot flip everything after it."""
    counts, template = [], []
    for forced, answer, numbers in zip(run.forced, reference.answers, reference.count_positions, strict=True):
        # Not strict: llama.cpp stops on an end-of-generation token that transformers may not stop on.
        for i, (choice, token) in enumerate(zip(forced.choices, answer.token_ids, strict=False)):
            (counts if i in numbers else template).append(choice == token)
    return (_mean(counts) if counts else None), (_mean(template) if template else None)


def image_sensitivity(counts: list[tuple[np.ndarray | None, np.ndarray | None]]) -> float | None:
    """How much the image moves the first count: mean TV distance between the count distribution with the
    real image and with a blank one, the answer's prefix the same. ~0 for a model (or a projector) that
    ignores the image. None when no answer states a count."""
    pairs = [(real, blank) for real, blank in counts if real is not None and blank is not None]
    return round(float(np.mean([likely_tv(blank, real) for real, blank in pairs])), 6) if pairs else None


def likely_tokens(reference: np.ndarray) -> np.ndarray:
    """The tokens the reference gives p > MIN_REFERENCE_P (its top token always)."""
    likely = np.flatnonzero(reference > np.log(MIN_REFERENCE_P))
    return likely if likely.size else np.array([int(np.argmax(reference))])


def likely_tv(logprobs: np.ndarray, reference: np.ndarray) -> float:
    """Total-variation distance between two next-token distributions, seen through the reference's likely
    tokens (`likely_tokens`) plus one bucket for all the others (0: the same, 1: disjoint)."""
    likely = likely_tokens(reference)
    p, q = np.exp(logprobs[likely]), np.exp(reference[likely])
    return float(0.5 * (np.abs(p - q).sum() + abs(q.sum() - p.sum())))


def count_mismatch(run: Run, reference: Run) -> float | None:
    """Mean TV distance between llama.cpp's and the reference's count distributions, image by image,
    both following the reference's own answer up to its count. None when no answer states a count."""
    pairs = [(f.count_logprobs, r.count_logprobs) for f, r in zip(run.forced, reference.answers, strict=True)
             if f.count_logprobs is not None and r.count_logprobs is not None]
    return float(np.mean([likely_tv(p, q) for p, q in pairs])) if pairs else None


def logprob_diff(logprobs: np.ndarray, reference: np.ndarray) -> float:
    """Largest |log p - log p_ref| over the reference's likely tokens (`likely_tokens`)."""
    likely = likely_tokens(reference)
    return float(np.abs(logprobs[likely] - reference[likely]).max())


def tokens_per_second(answers: list[Answer]) -> float:
    return sum(len(a.token_ids) for a in answers) / sum(a.seconds for a in answers)


def scores(run: Run, samples: list[dict]) -> dict:
    """Load time, speed, and the task: how often an answer parses, how often it is right."""
    parsed = [parse_answer(a.text) for a in run.answers]
    return {
        "load_seconds": round(run.load_seconds, 3),
        "tokens_per_second": round(tokens_per_second(run.answers), 2),
        "parse_rate": _mean([p is not None for p in parsed]),
        "accuracy": _mean([p == int(s["answer"]) for p, s in zip(parsed, samples, strict=True)]),
    }


def parity(run: Run, reference: Run) -> dict:
    """How closely a llama.cpp run follows the reference (the merged HF model) on the same images."""
    pairs = list(zip(run.answers, reference.answers, strict=True))
    answers = [(parse_answer(a.text), parse_answer(r.text)) for a, r in pairs]
    mismatch = count_mismatch(run, reference)
    count_agreement, template_agreement = forced_agreement(run, reference)
    return {
        "count_agreement": count_agreement,
        "template_agreement": template_agreement,
        "count_tv": None if mismatch is None else round(mismatch, 6),
        # Two answers that give no number are not an agreement.
        "answer_agreement": _mean([a is not None and a == r for a, r in answers]),
        "first_token_logprob_diff": round(max(logprob_diff(a.first_logprobs, r.first_logprobs)
                                              for a, r in pairs), 6),
        "same_answers": _mean([a.token_ids == r.token_ids for a, r in pairs]),
        "distinct_answers": len({tuple(a.token_ids) for a in run.answers}),
        "image_sensitivity": image_sensitivity([(f.count_logprobs, f.blank_count_logprobs) for f in run.forced]),
        "projector_error": round(projector_error(run.image_embeddings, reference.image_embeddings), 6),
    }


def _mean(values) -> float:
    values = [float(v) for v in values]
    return round(sum(values) / len(values), 4) if values else 0.0


def gate_failures(file_metrics: dict[str, dict], reference: dict, params: SmokeParams) -> list[str]:
    """One line per missed threshold: file, measure, value, threshold. Every file is gated on the counts
    (teacher-forced count agreement, the first count's distribution, parsed answers), the first token's
    log-probs, the image (its counts move with it as the merged model's do; its projector's embeddings)
    and, for quantized files, its accuracy next to the merged model's; unquantized files tightly,
    quantized ones looser. The merged model's own counts must move with the image too."""
    failures = []

    def check(path: str, measure: str, value, sense: str, key: str, threshold: float | None = None) -> None:
        threshold = getattr(params, key) if threshold is None else threshold
        if value is None:
            failures.append(f"{path}: {measure}: no answer of the merged model states a count, nothing to compare "
                            f"(smoke.{key})")
        elif (value < threshold) if sense == ">=" else (value > threshold):
            failures.append(f"{path}: {measure} {value:.4g} {'<' if sense == '>=' else '>'} {threshold:.4g} "
                            f"(smoke.{key})")

    reference_sensitivity = reference["image_sensitivity"]
    check("the merged model", "image_sensitivity", reference_sensitivity, ">=", "min_image_sensitivity")
    for m in file_metrics.values():
        kind = "f16" if m["file_type"] in UNQUANTIZED else "quant"
        check(m["path"], "count_agreement", m["count_agreement"], ">=", f"min_{kind}_count_agreement")
        check(m["path"], "count_tv", m["count_tv"], "<=", f"max_{kind}_count_tv")
        check(m["path"], "answer_agreement", m["answer_agreement"], ">=", f"min_{kind}_answer_agreement")
        check(m["path"], "first_token_logprob_diff", m["first_token_logprob_diff"], "<=", f"max_{kind}_logprob_diff")
        if kind == "quant":
            m["accuracy_drop"] = round(reference["accuracy"] - m["accuracy"], 4)
            check(m["path"], "accuracy_drop", m["accuracy_drop"], "<=", "max_quant_accuracy_drop")
        if reference_sensitivity:  # the file's counts move with the image as much as the merged model's do
            check(m["path"], "image_sensitivity", m["image_sensitivity"], ">=", "min_image_sensitivity_ratio",
                  threshold=params.min_image_sensitivity_ratio * reference_sensitivity)
        check(m["path"], "projector_error", m["projector_error"], "<=", "max_projector_error")
    return failures


def evaluated_agreement(run: Run, samples: list[dict], predictions_path: Path, merged_dir: Path,
                        threshold: float) -> float:
    """The merged model is the evaluated one: on the smoke images that `evaluate` answered, its greedy
    answers equal evaluate's trained predictions (base + adapter, same prompt, image budget and
    decoding): the same text as far as both go, or the same parsed count. A merge that dropped the
    adapter, or a module of it, ships another model; that stops the stage here, in one line."""
    trained = {}
    try:
        for line in Path(predictions_path).read_text().splitlines():
            record = json.loads(line)
            if record["split"] == "test" and record["model"] == "trained":
                trained[record["id"]] = record
    except FileNotFoundError:
        raise VgrpoError(f"{predictions_path}: not found (run the evaluate stage: dvc repro evaluate)") from None
    pairs = [(s["id"], a, trained[s["id"]]) for s, a in zip(samples, run.answers, strict=True) if s["id"] in trained]
    if not pairs:
        raise VgrpoError(f"{predictions_path}: evaluate answered none of smoke's {len(samples)} test images (raise "
                         "evaluate.max_samples.test, or lower smoke.num_images)")

    def same(answer: Answer, record: dict) -> bool:
        text, evaluated = answer.text.strip(), record["completion"].strip()
        parsed = parse_answer(answer.text)
        return text.startswith(evaluated) or evaluated.startswith(text) or (parsed is not None
                                                                              and parsed == record["parsed"])

    agree = [same(answer, record) for _, answer, record in pairs]
    share = round(sum(agree) / len(agree), 4)
    if share < threshold:
        first = next(i for i, ok in enumerate(agree) if not ok)
        image, answer, record = pairs[first]
        raise VgrpoError(f"{merged_dir}: the merged model answers {sum(agree)} of {len(agree)} smoke images as "
                         f"evaluate's trained model did ({share:.4g} < {threshold:g}, smoke.min_evaluated_agreement; "
                         f"{image}: {parse_answer(answer.text)} here, {record['parsed']} in evaluate): the merge "
                         "is not the evaluated model (a dropped adapter or LoRA module?)")
    return share


# --- The stage ------------------------------------------------------------------------------------

def smoke_samples(data_dir: Path, n: int) -> list[dict]:
    from vgrpo.shapes import load_dataset

    test = load_dataset(data_dir, splits=("test",))["test"]
    if len(test) < n:
        raise VgrpoError(f"{data_dir}: the test split has {len(test)} images, smoke.num_images asks for {n}")
    return [test[i] for i in range(n)]


def check_merged(merged_dir: Path) -> None:
    if not (Path(merged_dir) / "config.json").is_file() or not any(Path(merged_dir).glob("*.safetensors")):
        raise VgrpoError(f"{merged_dir}: no merged model here (run the export stage: dvc repro export)")


def run_smoke(config: Config, dtype: str, merged_dir: Path, gguf_dir: Path, data_dir: Path, reports_dir: Path,
              predictions_path: Path, log=print) -> tuple[dict, list[str]]:
    """Answer the same test images with the merged HF model (checked against evaluate's predictions
    first) and every GGUF; write metrics and predictions; return the metrics and the thresholds missed."""
    params = config.smoke
    check_merged(merged_dir)
    texts, projector = find_gguf_files(gguf_dir)  # every header, before any model loads
    samples = smoke_samples(data_dir, params.num_images)
    torch.set_num_threads(params.n_threads)  # the same CPU threads on both sides

    if torch.cuda.is_available():
        memory.check_fits(memory.smoke_plan(config, memory.model_shape(str(merged_dir)), dtype),
                          "the merged model in smoke", config, *memory.gpu_free_and_name())
    if not Path(predictions_path).is_file():
        raise VgrpoError(f"{predictions_path}: not found (run the evaluate stage: dvc repro evaluate)")
    runs = {}
    runs["hf"], freed = run_hf(merged_dir, config, dtype, samples)
    agreement = evaluated_agreement(runs["hf"], samples, predictions_path, merged_dir, params.min_evaluated_agreement)
    log(f"smoke: hf {tokens_per_second(runs['hf'].answers):.1f} tokens/s; freed the transformers model "
        f"({freed['memory_freed_gb']:.2f} GiB {'of GPU memory' if torch.cuda.is_available() else 'of weights'}) "
        "before llama.cpp loads")
    files = {}
    for text in texts:
        run = runs[text.path.name] = run_llama(text, projector, samples, params, runs["hf"])
        m = files[text.path.name] = {
            "path": str(text.path), "file_type": text.file_type, "mmproj": projector.path.name,
            "n_gpu_layers": gpu_layers(text, projector, params),
            **scores(run, samples), **parity(run, runs["hf"]),
            "tensor_types": text.tensor_types, "k_quant_share": k_quant_share(text.tensor_types)}
        log(f"smoke: {text.path.name} {m['tokens_per_second']:.1f} tokens/s, count agreement "
            f"{m['count_agreement']}, count TV {m['count_tv']}, answers agree {m['answer_agreement']}, image "
            f"sensitivity {m['image_sensitivity']}")
    hf_sensitivity = image_sensitivity([(a.count_logprobs, a.blank_count_logprobs) for a in runs["hf"].answers])
    metrics = {"num_images": len(samples),
               "hf": {**scores(runs["hf"], samples), "dtype": dtype, "load_in_4bit": config.train.load_in_4bit,
                      "evaluated_agreement": agreement, "image_sensitivity": hf_sensitivity, **freed},
               "files": files}
    records = [{"model": name, "id": s["id"], "question": s["question"], "answer": s["answer"],
                "completion": a.text, "parsed": parse_answer(a.text), "tokens": len(a.token_ids)}
               for name, run in runs.items() for s, a in zip(samples, run.answers, strict=True)]
    metrics["peak_vram_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None
    failures = gate_failures(files, metrics["hf"], params)
    metrics["gate"] = {"passed": not failures, "failures": failures}
    write_jsonl(Path(reports_dir) / "predictions.jsonl", records)
    write_json(Path(reports_dir) / "metrics.json", metrics)
    return metrics, failures

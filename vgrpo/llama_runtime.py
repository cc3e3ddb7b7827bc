"""llama.cpp's side of smoke: load a text GGUF with its mmproj in llama-cpp-python (repacking as
`smoke.cpu_repack` says, layers on the GPU as `smoke.n_gpu_layers` says), answer image questions
greedily with the shared prompt, follow a reference answer token by token (teacher forcing), and read
the projector's image embeddings."""

from __future__ import annotations

import ctypes
import io
import sys
import time
from contextlib import contextmanager

import llama_cpp
import llama_cpp.llama_cpp as llama_cpp_lib
import llama_cpp.mtmd_cpp as mtmd_cpp
import numpy as np
import torch
from llama_cpp.llama_chat_format import MTMDChatHandler

from vgrpo.answers import Answer, Forced, Run, blank_image, log_softmax
from vgrpo.config import SmokeParams
from vgrpo.gguf_files import GGUFError, GGUFInfo
from vgrpo.prompts import llama_cpp_messages

LLAMA_CPP_RESERVE = 1.0e9  # GPU bytes llama.cpp needs beside the layers it offloads: KV cache, compute buffers
_GGML_LOG_LEVEL_ERROR = 3

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
            first.append(log_softmax(np.asarray(scores, dtype=np.float64)))
        if len(ids) == capture_at:
            captured.append(log_softmax(np.asarray(scores, dtype=np.float64)))
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
    choice = result["choices"][0]
    return Answer(choice["message"]["content"] or "", ids, first[0], seconds, captured[0] if captured else None,
                  cut=choice.get("finish_reason") == "length")


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


def run_llama(text: GGUFInfo, projector: GGUFInfo, samples: list[dict], params: SmokeParams, reference: Run) -> Run:
    with open_llama(text, projector, params) as (llama, load_seconds):
        answers = [llama_answer(llama, s["question"], s["image"], params.max_new_tokens) for s in samples]
        forced = [llama_forced(llama, s["question"], s["image"], r.token_ids, next(iter(at), None))
                  for s, r, at in zip(samples, reference.answers, reference.count_positions, strict=True)]
        embeddings = [llama_image_embeddings(llama, s["image"]) for s in samples]
    return Run(answers, load_seconds, embeddings, forced)

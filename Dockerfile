# CUDA image that runs the vgrpo DVC pipeline on a GPU (entrypoint: dvc).
#
#   docker build --build-arg USER_UID="$(id -u)" -t vgrpo .
#   docker run --gpus all --ipc=host -v "$PWD":/workspace -v vgrpo-cache:/home/vgrpo/.cache vgrpo                         # exp run -S profile=full
#   docker run --gpus all --ipc=host -v "$PWD":/workspace -v vgrpo-cache:/home/vgrpo/.cache vgrpo exp run -S profile=gpu16
#   docker run --gpus all --ipc=host -v "$PWD":/workspace -v vgrpo-cache:/home/vgrpo/.cache --entrypoint scripts/gpu_check.sh vgrpo \
#       --work /workspace/gpu-check
#
# The default command names its profile: `dvc repro` would run whatever params.yaml holds (it does not
# compose conf/), which after the CPU demo is the tiny profile.
#
# Mount your clone at /workspace: DVC needs its .git (kept out of the image by .dockerignore) and
# writes data/, models/ and reports/ there, so outputs land on the host. The cache volume keeps
# downloaded weights (HF_HOME), the tiny model, Unsloth's compiled kernels and Triton's between runs.
# USER_UID should be the uid that owns the clone, or the pipeline cannot write to it. --ipc=host:
# NCCL (train.num_processes > 1) shares memory between processes through /dev/shm, 64 MB by default.
#
# CUDA 13.0 (the default): PyPI's torch 2.14.1 is the CUDA 13.0 build, so pip's default index serves it. The host
# needs the NVIDIA Container Toolkit and driver 580 or newer (`nvidia-smi` prints it). CUDA 13 runs
# Turing (T4, 7.5) and newer. With an older driver (560-579), build the CUDA 12.6 variant:
#   docker build --build-arg CUDA_IMAGE=nvidia/cuda:12.6.3-devel-ubuntu24.04 \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 --build-arg USER_UID="$(id -u)" -t vgrpo .
# (PyTorch 2.14 publishes CUDA 12.6, 13.0 and 13.2 builds only; the build stops in one line when the
# image's CUDA and torch's differ.)
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04

# devel, not runtime: llama-cpp-python is compiled here with nvcc, and at run time Triton
# (Unsloth) and DeepSpeed compile kernels, which needs the toolkit and a C compiler. No cuDNN
# flavour: the torch wheels bring their own cuDNN.
FROM ${CUDA_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Ubuntu 24.04's python3 is 3.12, inside pyproject's >=3.11,<3.14. git: DVC needs it at run time.
# DL3008: Ubuntu's archive keeps only the newest build of each package, so an exact version pin
# breaks the build at the next security update; the base tag already fixes the release (noble).
# safe.directory: the mounted clone may belong to a uid other than the container's user, and git
# (hence DVC) refuses to work in a repository owned by someone else. The identity is a fallback
# for `dvc exp run`, which commits experiments to hidden refs: the host's ~/.gitconfig is not in
# the container, and the clone's own config (or a mounted ~/.gitconfig) takes precedence.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential \
        ca-certificates \
        cmake \
        git \
        python3 \
        python3-dev \
        python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && git config --system --add safe.directory /workspace \
    && git config --system user.name vgrpo \
    && git config --system user.email vgrpo@localhost \
    && python3 -m venv /opt/venv

# The venv lives outside /workspace so that mounting a clone there does not hide it.
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# torch before the project: pyproject pins the same versions, which the wheels installed here
# satisfy, so the project install keeps them. Its own layer, so that a pyproject change does not
# download it again. TORCH_INDEX: empty for pip's default index (PyPI, whose torch is the CUDA 13.0
# build), or a PyTorch index (.../whl/cu126). The check: torch's CUDA is the image's (CUDA_VERSION comes
# with the nvidia/cuda image).
ARG TORCH_INDEX=
RUN if [ -n "${TORCH_INDEX}" ]; then export PIP_INDEX_URL="${TORCH_INDEX}"; fi \
    && pip install --no-cache-dir \
    torch==2.14.1 \
    torchvision==0.29.1 \
    && python -c "import os, sys, torch; image = '.'.join(os.environ['CUDA_VERSION'].split('.')[:2]); \
sys.exit(None if torch.version.cuda == image else f'torch {torch.__version__} is built for CUDA {torch.version.cuda}, \
the image has CUDA {image}: give TORCH_INDEX the index of its CUDA (see the top of this file)')"

# llama-cpp-python from source with CUDA, in its own layer because the compile takes long; the
# project install below finds the pinned version present and keeps it (deps come from there).
# - No GPU exists during `docker build`: GGML_NATIVE=off stops -march=native (which would tie the
#   CPU code to the build host), and the CUDA architectures are named instead of detected.
#   75 T4/RTX 20xx, 80 A100/A30, 86 RTX 30xx/A10/A40, 89 RTX 40xx/L4/L40, 90 H100/H200; 90-virtual adds
#   PTX that newer GPUs (Blackwell) JIT-compile on first use (slow the first time). For an RTX 50xx
#   or RTX PRO 6000 Blackwell, add its own kernels: --build-arg CUDA_ARCHITECTURES="75-real;...;90-virtual;120-real"
#   (setup.sh uses the same list: CUDA_ARCHITECTURES=... EXTRAS=gpu ./setup.sh).
# - The driver library libcuda.so.1 comes from the host at run time; CMake links the shared
#   libraries against the toolkit's stub (lib64/stubs/libcuda.so), and --allow-shlib-undefined
#   lets any executable that links them leave the driver's symbols for run time (as llama.cpp's
#   own CUDA image does).
ARG CUDA_ARCHITECTURES="75-real;80-real;86-real;89-real;90-real;90-virtual"
RUN CMAKE_ARGS="-DGGML_CUDA=on -DGGML_NATIVE=off -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES} -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    pip install --no-cache-dir --no-binary llama-cpp-python --no-deps \
    llama-cpp-python==0.3.36

WORKDIR /workspace

# Only what setup.sh reads, so editing code does not reinstall everything. The empty vgrpo/ lets
# the editable install map the package to /workspace/vgrpo, where the real one is copied next
# (and where a mounted clone puts its own). setup.sh reuses /opt/venv and unpacks llama.cpp's
# converter into /opt/venv/llama.cpp, where vgrpo.vendor looks for it (sys.prefix).
# The checks fail the build if the project install replaced the CUDA builds of torch or llama.cpp.
COPY pyproject.toml setup.sh ./
RUN mkdir vgrpo \
    && touch vgrpo/__init__.py \
    && VENV_DIR=/opt/venv EXTRAS=gpu ./setup.sh \
    && python -c "import os, sys, torch; image = '.'.join(os.environ['CUDA_VERSION'].split('.')[:2]); \
sys.exit(None if torch.version.cuda == image else f'the project install replaced torch: CUDA {torch.version.cuda}')" \
    && test -n "$(find /opt/venv -name 'libggml-cuda.so*' -print -quit)" \
    && test -f /opt/venv/llama.cpp/convert_hf_to_gguf.py

# The user comes after the installs: a build-arg invalidates every later layer, and a different
# USER_UID should not recompile llama.cpp. The base image's `ubuntu` user holds uid 1000, the uid
# most hosts give their first user, so it makes way. The venv stays root's: read-only at run time.
ARG USER_UID=1000
RUN if id ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
    && groupadd --gid "${USER_UID}" vgrpo \
    && useradd --create-home --uid "${USER_UID}" --gid "${USER_UID}" --shell /bin/bash vgrpo \
    && install -d -o vgrpo -g vgrpo /home/vgrpo/.cache /home/vgrpo/.cache/huggingface \
    && chown -R vgrpo:vgrpo /workspace

COPY --chown=vgrpo:vgrpo . .

# Caches in the volume, not in the mounted clone: Unsloth compiles its patched modules into
# UNSLOTH_COMPILE_LOCATION (default: ./unsloth_compiled_cache, in the working directory).
ENV HF_HOME=/home/vgrpo/.cache/huggingface \
    UNSLOTH_COMPILE_LOCATION=/home/vgrpo/.cache/unsloth_compiled_cache \
    TRITON_CACHE_DIR=/home/vgrpo/.cache/triton
# Numeric, so that a runtime that checks for non-root (Kubernetes runAsNonRoot) can tell.
USER ${USER_UID}:${USER_UID}

ENTRYPOINT ["dvc"]
CMD ["exp", "run", "-S", "profile=full"]

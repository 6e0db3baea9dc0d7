"""What serves a batch once the runtime has formed it and its device is free.

A backend answers :meth:`Backend.run` for a batch with one generated text per prompt; it
tells the batch, as it starts, when its first token and its end will come where it knows
(:meth:`~simulator.serve.runtime.ServeBatch.plan`), which is what a streaming reply spreads
its tokens over. Three backends (:data:`BACKENDS`, by ``--backend`` name):

* ``sleep`` — the profile's service model: the batch's time is drawn from the task's own
  stream (the simulator's streams: the same seed draws the same service times in the same
  batch order), its first token at the profile's first-token offset, and the batch sleeps
  that long in server seconds. On a processor-sharing GPU concurrent batches progress at
  rate 1/n each, as the model has it (:class:`SharedGpuTime`). The text is ``max_tokens``
  common English words (:data:`WORDS`), one token each for a client's tokenizer.
* ``harness`` — the real torch decoder of ``simctl profile`` (random weights), batched
  speculative decoding of each GPU batch in a worker thread per GPU (``cuda:i`` where there
  is one, else the CPU); torch is imported only here.
* ``openai`` — a real OpenAI-compatible engine per GPU: a batch's prompts go to that GPU's
  URL in one ``/v1/completions`` request (a list prompt), so the server is a batching router
  in front of them. An engine that takes one prompt per request (GuideLLM's mock server,
  ``simctl serve`` itself) gets one request per prompt, all at once: forced with
  ``per_prompt=True``, else found out by the first batch of several prompts sent there: a
  list that the engine refuses (any status but 200) or answers with the wrong number of
  choices is sent again prompt by prompt, and when that works the engine's URL is taken as
  one-prompt-per-request from then on. A batch of one prompt is always one plain string.

Every backend serves a task on the CPU (``resource = "cpu"``: the design notes' graph
solver, which none of them has) with the ``sleep`` backend's profile time.
"""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from simulator.errors import BackendError
from simulator.profile.iteration import first_token_seconds
from simulator.scenario import Scenario
from simulator.serve.runtime import Device, PromptJob, Runtime, ServeBatch

_PIECE = re.compile(r"\s*\S+")


def pieces(text: str) -> list[str]:
    """``text`` cut into stream pieces, one word with its leading space each (a token)."""
    return _PIECE.findall(text) or ([text] if text else [])


def prompt_tokens(text: str, vocab: int) -> list[int]:
    """``text`` as the harness's token ids: one per four characters, the count
    :func:`~simulator.trace.classify.estimate_tokens` gives (the count a trace, the load
    generator's invented texts and the simulator all use), so a prompt of the trace's P
    tokens is a prefill of P tokens on the real decoder too."""
    from simulator.trace.classify import estimate_tokens

    data = text.encode("utf-32-le")  # one 4-byte unit per code point, as len() counts
    units = [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]
    return [sum(units[4 * i:4 * i + 4]) % vocab for i in range(estimate_tokens(text))]


#: The sleep backend's words: common short English words, each one token with its leading
#: space for the usual BPE tokenizers (GPT-2's, Llama's, Qwen's), so a client that counts
#: the reply's tokens itself (AIPerf, GuideLLM) counts what ``usage`` says
WORDS = ("the", "of", "and", "to", "in", "is", "that", "it", "for", "was", "on", "are", "as", "with", "be",
         "at", "by", "this", "have", "from", "or", "one", "had", "not", "but", "what", "all", "were", "when",
         "we", "there", "can", "an", "your", "which", "their", "said", "if", "do", "will", "each", "about",
         "how", "up", "out", "them", "then", "no", "many", "any", "so", "these", "would", "other", "into",
         "has", "more", "may", "two", "like", "only", "see", "time", "could")


def placeholder_text(job: PromptJob) -> str:
    """The sleep backend's answer: ``max_tokens`` words of :data:`WORDS` in turn, each after
    a space (one token each: :func:`pieces` cuts it into ``max_tokens`` stream pieces)."""
    return "".join(f" {WORDS[i % len(WORDS)]}" for i in range(job.max_tokens))


class Backend(ABC):
    """Serves batches (module docstring)."""

    name = ""

    def check(self, scenario: Scenario) -> None:  # noqa: B027 (a backend may need nothing)
        """A :class:`BackendError` if this backend cannot serve ``scenario`` (before serving)."""

    async def start(self, runtime: Runtime) -> None:  # noqa: B027
        """Prepare (load models, open connections); called once, in the server's loop."""

    async def close(self) -> None:  # noqa: B027
        """Release what :meth:`start` took."""

    @abstractmethod
    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]:
        """The batch's texts, in its prompts' order (an exception fails every prompt)."""

    def planned_text(self, job: PromptJob) -> str | None:
        """The text ``job`` will get, where known before it is done (a streaming reply can
        then send its tokens as they come), else ``None``."""
        return None


class SharedGpuTime:
    """Processor sharing in server time: the n batches on a GPU each progress at rate 1/n."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.jobs: dict[asyncio.Future, float] = {}  # batch -> solo seconds left
        self.last = 0.0
        self.timer: asyncio.TimerHandle | None = None

    def _advance(self) -> None:
        now = self.runtime.clock.now()
        if self.jobs:
            share = (now - self.last) / len(self.jobs)
            for future in self.jobs:
                self.jobs[future] -= share
        self.last = now

    def _schedule(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.jobs:
            left = min(self.jobs.values())
            self.timer = self.runtime.call_later(max(left, 0.0) * len(self.jobs), self._tick)

    def _tick(self) -> None:
        self._advance()
        for future, left in list(self.jobs.items()):
            if left <= 1e-9:
                del self.jobs[future]
                if not future.done():
                    future.set_result(max(-left, 0.0))  # solo seconds it ran past its end
        self._schedule()

    async def serve(self, work: float) -> float:
        """Take ``work`` solo seconds of the GPU; how many it ran past them (a late timer)."""
        self._advance()
        future = asyncio.get_running_loop().create_future()
        self.jobs[future] = work
        self._schedule()
        try:
            return float(await future)
        finally:
            if future in self.jobs:  # cancelled: the others speed up
                self._advance()
                del self.jobs[future]
                self._schedule()


class SleepBackend(Backend):
    """Each batch takes the profile's sampled service time (module docstring)."""

    name = "sleep"

    def __init__(self) -> None:
        self._shared: dict[int, SharedGpuTime] = {}

    def draw(self, runtime: Runtime, batch: ServeBatch) -> tuple[float, float]:
        """(work, first-token offset) of the batch in server seconds, drawn from its task's stream."""
        service = runtime.service_of(batch.task)
        rng = runtime.service_rng(batch.task)
        if batch.generations == 1:
            work = float(service.sample(batch.shape, rng))
        else:
            work = float(sum([service.sample(batch.shape, rng) for _ in range(batch.generations)]))
        first = first_token_seconds(runtime.profile.tasks[batch.task], service, batch.shape, work)
        return work, float(first)

    async def sleep(self, runtime: Runtime, batch: ServeBatch) -> None:
        work, first = self.draw(runtime, batch)
        batch.plan(runtime, first, work)
        await self.serve_work(runtime, batch.device, work)

    async def serve_work(self, runtime: Runtime, device: Device, work: float) -> float:
        """Take ``work`` server seconds of ``device``'s time (a batch, or a continuous
        engine's iteration): a sleep, stretched on a processor-sharing GPU by what else runs
        there. Returns the device seconds it ran past ``work`` (the event loop's timers wake
        late), which a caller running back to back may take off its next sleep."""
        if device.gpu_id >= 0 and not device.exclusive:
            shared = self._shared.get(device.gpu_id)
            if shared is None:
                shared = self._shared[device.gpu_id] = SharedGpuTime(runtime)
            return await shared.serve(work)
        end = runtime.clock.now() + work
        await asyncio.sleep(runtime.clock.real(work))
        return max(runtime.clock.now() - end, 0.0)

    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]:
        await self.sleep(runtime, batch)
        return [placeholder_text(job) for job in batch.jobs]

    def planned_text(self, job: PromptJob) -> str | None:
        return placeholder_text(job)


class HarnessBackend(SleepBackend):
    """Batched speculative decoding on the harness's torch decoder, a thread per GPU."""

    name = "harness"

    def __init__(self, target: str = "tiny", draft: str = "tiny", lookahead: int = 3, acceptance: float = 0.7,
                 device: str | None = None, max_prompt_tokens: int = 256, threads: int = 1) -> None:
        super().__init__()
        #: torch's intra-op threads (0: torch's default), pinned as ``simctl profile``
        #: pins them: on a shared CPU, spinning intra-op threads make each step wait for a
        #: descheduled one, and a 40 ms batch can take seconds
        self.threads = threads
        self.target, self.draft = target, draft
        self.lookahead, self.acceptance = lookahead, acceptance
        self.device = device
        self.max_prompt_tokens = max_prompt_tokens
        self._executors: dict[int, ThreadPoolExecutor] = {}
        self._decoders: dict[int, Any] = {}

    def check(self, scenario: Scenario) -> None:
        """A :class:`BackendError` if torch or a preset is missing."""
        try:
            import torch  # noqa: F401
        except ModuleNotFoundError:
            raise BackendError(None, None, "--backend", "the harness backend needs torch: pip install "
                               "'simctl-llm[harness]' (for the CPU build: pip install torch==2.13.0)") from None
        from simulator.errors import UnknownPreset
        from simulator.harness.presets import get_preset

        try:
            get_preset(self.target), get_preset(self.draft)
        except UnknownPreset as exc:
            raise BackendError(None, None, "--harness-model", str(exc)) from None

    def _torch_device(self, gpu: int) -> Any:
        import torch

        if self.device is not None:
            return torch.device(self.device)
        if torch.cuda.is_available():
            return torch.device(f"cuda:{gpu % torch.cuda.device_count()}")
        return torch.device("cpu")

    def _load(self, gpu: int) -> Any:
        import torch

        from simulator.harness.decoder import Decoder
        from simulator.harness.presets import get_preset
        from simulator.harness.specdec import Acceptance, SpecDecoder

        dev = self._torch_device(gpu)
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        target = Decoder(get_preset(self.target), dev, dtype, seed=gpu)
        draft = Decoder(get_preset(self.draft), dev, dtype, seed=gpu + 1)
        return SpecDecoder(target, draft, self.lookahead, acceptance=Acceptance.inject(self.acceptance),
                           graphs=dev.type == "cuda", seed=gpu)

    async def start(self, runtime: Runtime) -> None:
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
        loop = asyncio.get_running_loop()
        for gpu in range(len(runtime.gpus)):
            executor = self._executors[gpu] = ThreadPoolExecutor(1, thread_name_prefix=f"simctl-gpu{gpu}")
            self._decoders[gpu] = await loop.run_in_executor(executor, self._load, gpu)

    async def close(self) -> None:
        for executor in self._executors.values():
            executor.shutdown(wait=False, cancel_futures=True)

    def _generate(self, gpu: int, texts: Sequence[str], max_new: Sequence[int]) -> list[str]:
        import torch

        decoder = self._decoders[gpu]
        vocab = decoder.target.shape.vocab
        rows = [prompt_tokens(text, vocab)[: self.max_prompt_tokens] for text in texts]
        longest = max(len(r) for r in rows)
        prompts = torch.zeros(len(rows), longest, dtype=torch.long)
        for i, row in enumerate(rows):
            prompts[i, : len(row)] = torch.tensor(row)
        generation = decoder.generate(prompts, [len(r) for r in rows], list(max_new))
        return ["".join(f" {t}" for t in tokens) for tokens in generation.tokens]

    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]:
        if batch.device.gpu_id < 0:
            return await SleepBackend.run(self, runtime, batch)
        batch.plan(runtime, None, None)
        gpu = batch.device.gpu_id
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executors[gpu], self._generate, gpu,
                                          [j.text for j in batch.jobs], [j.max_tokens for j in batch.jobs])

    def planned_text(self, job: PromptJob) -> str | None:
        return None


class OpenAIBackend(SleepBackend):
    """A real OpenAI-compatible engine per GPU (module docstring)."""

    name = "openai"

    def __init__(self, urls: Sequence[str], model: str | None = None, per_prompt: bool = False) -> None:
        super().__init__()
        if not urls or any(not u.startswith(("http://", "https://")) for u in urls):
            raise BackendError(None, None, "--backend", f"openai:URL[,URL...] needs http(s) URLs, got "
                               f"{','.join(urls) or 'none'!r}")
        self.urls = [u.rstrip("/") for u in urls]
        self.model = model
        self.client: Any = None
        #: per URL: True sends one request per prompt, False one list request per batch;
        #: a URL not here is probed by its first batch of several prompts
        self.per_prompt: dict[str, bool] = {u: True for u in self.urls} if per_prompt else {}

    @staticmethod
    def _completions(url: str) -> str:
        if url.endswith("/v1/completions"):
            return url
        return url + "/completions" if url.endswith("/v1") else url + "/v1/completions"

    def check(self, scenario: Scenario) -> None:
        import importlib.util

        if importlib.util.find_spec("httpx") is None:
            raise BackendError(None, None, "--backend", "the openai backend needs the Python package 'httpx': "
                               "pip install httpx")
        if len(self.urls) != scenario.gpus:
            raise BackendError(scenario.source, "run", "gpus",
                               f"--backend openai gives {len(self.urls)} URL(s) for {scenario.gpus} GPU(s) of "
                               f"the scenario: give one URL per GPU (or --set run.gpus={len(self.urls)})")

    async def start(self, runtime: Runtime) -> None:
        import httpx

        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None))

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def _model(self, url: str) -> str:
        if self.model is None:
            base = self._completions(url).removesuffix("/completions")
            try:
                listed = (await self.client.get(base + "/models")).json()
                self.model = str(listed["data"][0]["id"])
            except Exception:
                self.model = "default"
        return self.model

    async def _post(self, url: str, prompt: str | list[str], max_tokens: int) -> list[str]:
        """The texts ``url`` answers for ``prompt`` (a string or a list), in prompt order; a
        ``RuntimeError`` naming the engine's answer if it is not 200 with one choice each."""
        body = {"model": await self._model(url), "prompt": prompt, "max_tokens": max_tokens}
        response = await self.client.post(self._completions(url), json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            choices = response.json().get("choices")
        except (ValueError, AttributeError):
            choices = None
        wanted = len(prompt) if isinstance(prompt, list) else 1
        if not isinstance(choices, list) or len(choices) != wanted:
            raise RuntimeError(f"{url} answered {len(choices) if isinstance(choices, list) else 'no'} choices "
                               f"for {wanted} prompts")
        ordered = sorted(choices, key=lambda c: c.get("index", 0))
        return [str(c.get("text", "")) for c in ordered]

    async def _one_by_one(self, url: str, jobs: Sequence[PromptJob]) -> list[str]:
        answers = await asyncio.gather(*(self._post(url, j.text, j.max_tokens) for j in jobs))
        return [a[0] for a in answers]

    async def run(self, runtime: Runtime, batch: ServeBatch) -> list[str]:
        device: Device = batch.device
        if device.gpu_id < 0:
            return await SleepBackend.run(self, runtime, batch)
        batch.plan(runtime, None, None)
        url = self.urls[device.gpu_id]
        jobs = batch.jobs
        if len(jobs) == 1:
            return await self._post(url, jobs[0].text, jobs[0].max_tokens)
        if self.per_prompt.get(url):
            return await self._one_by_one(url, jobs)
        texts = [j.text for j in jobs]
        if url in self.per_prompt:  # takes lists
            return await self._post(url, texts, max(j.max_tokens for j in jobs))
        try:
            answers = await self._post(url, texts, max(j.max_tokens for j in jobs))
        except RuntimeError as refused:
            try:
                answers = await self._one_by_one(url, jobs)
            except RuntimeError as error:  # not the list: the engine fails plain prompts too
                raise error from refused
            self.per_prompt[url] = True
            return answers
        self.per_prompt[url] = False
        return answers

    def planned_text(self, job: PromptJob) -> str | None:
        return None


#: ``--backend`` names
BACKENDS = ("sleep", "harness", "openai:URL[,URL...]")


def backend_from_spec(spec: str, **options: Any) -> Backend:
    """The backend ``spec`` names: ``sleep``, ``harness`` or ``openai:URL[,URL...]``."""
    name, _, rest = spec.partition(":")
    if name == "sleep" and not rest:
        return SleepBackend()
    if name == "harness" and not rest:
        return HarnessBackend(**{k: v for k, v in options.items() if k in (
            "target", "draft", "lookahead", "acceptance", "device", "threads") and v is not None})
    if name == "openai":
        return OpenAIBackend([u for u in rest.split(",") if u], options.get("model"),
                             per_prompt=bool(options.get("per_prompt")))
    raise BackendError(None, None, "--backend", f"unknown backend {spec!r}; valid: {', '.join(BACKENDS)}")

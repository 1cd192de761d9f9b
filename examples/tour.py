"""A tour of torchdict: the examples of the getting-started guide, run on torchdict.

Each section prints what it shows. Run with ``bash scripts/tour.sh`` (or ``python examples/tour.py``).
"""
from __future__ import annotations

import os
import shutil
import tempfile

import torch
from torch import nn

from torchdict import TensorDict, TensorDictBase, TensorDictParams, lazy_stack, pad_sequence, tensorclass

# The sections live beside this file (python puts examples/ first on sys.path when it runs tour.py).
from tour_common import section
from tour_storage import archives, hdf5_and_zarr, store, tables_and_files, tensorclass_readers


def basic_usage() -> None:
    section("Basic usage")
    td = TensorDict(a=0, b=1)
    print(td)
    td = TensorDict({"a": 0, "b": 1})
    td = TensorDict(a=0, non_tensor="a string!")
    assert td["non_tensor"] == "a string!"
    td = TensorDict()
    td["a"] = 0
    print(td)
    td = TensorDict(lock=True)
    try:
        td["a"] = 0
    except RuntimeError as error:
        print(f"RuntimeError: {error}")


def metadata() -> None:
    section("Metadata")
    data = TensorDict({
        "key 1": torch.ones(3, 4, 5),
        "key 2": torch.zeros(3, 4, 5, dtype=torch.bool),
    }, batch_size=[3, 4])
    print("batch_size:", data.batch_size)
    # The guide uses "cuda:0"; without a GPU the meta device shows the same casting.
    device = "cuda:0" if torch.cuda.is_available() else "meta"
    data = TensorDict({
        "key 1": torch.ones(3, 4, 5),
        "key 2": torch.zeros(3, 4, 5, dtype=torch.bool),
    }, batch_size=[3, 4], device=device)
    data["key 3"] = torch.randn(3, 4, device="cpu")
    assert data["key 3"].device == torch.device(device)
    print("key 3 was cast to", data["key 3"].device)
    data.clear_device_()
    print("after clear_device_():", data.device)


def specialised_dictionary() -> None:
    section("TensorDict as a specialised dictionary")
    td = TensorDict(a=0, b=1).exclude("b")
    print(td)
    td = TensorDict(a=0, b=0, c=0)
    td_ab, td_c = td.split_keys(["a", "b"])
    print(td_ab)
    data = TensorDict({"key 1": torch.ones(3, 4, 5), "key 2": torch.zeros(3, 4, 5, dtype=torch.bool)},
                      batch_size=[3, 4])
    data["nested", "key"] = torch.zeros(3, 4)
    data["nested", ("supernested", ("key",))] = torch.zeros(3, 4)
    assert (data["nested", "supernested", "key"] == 0).all()
    assert (("nested",), "supernested", (("key",),)) in data.keys(include_nested=True)
    print("nested keys:", list(data.keys(include_nested=True, leaves_only=True)))
    data = TensorDict({"a-tensor": torch.randn(1, 2)}, batch_size=[1, 2])
    data["non-tensor"] = "a string!"
    assert data["non-tensor"] == "a string!"
    # Stacking keeps one value per element; indexing back to one input gives its value.
    steps = torch.stack([TensorDict({"obs": torch.zeros(2), "phase": phase}, batch_size=[2])
                         for phase in ("warmup", "train")])
    print("stacked non-tensor:", steps["phase"], "->", steps[1]["phase"])
    print("as plain Python:", steps[:, 0].tolist(convert_tensors=True), "|", steps.param_count(), "elements")
    # Other containers in and out: namedtuples, dataclasses (from_any dispatches on the type).
    as_tuple = steps[0].to_namedtuple()
    print("to_namedtuple:", type(as_tuple).__name__, as_tuple._fields, "->",
          TensorDict.from_any(as_tuple, batch_size=[2]).batch_size)
    # update merges sub-TensorDicts; update_batch_size=True takes the source's batch size at every
    # level, provided the source replaces every leaf (otherwise it is refused before any write).
    episode = TensorDict({"obs": torch.zeros(4, 3), "info": {"step": torch.zeros(4)}}, batch_size=[4])
    longer = TensorDict({"obs": torch.ones(6, 3), "info": {"step": torch.arange(6.0)}}, batch_size=[6])
    episode.update(longer, update_batch_size=True)
    print("after update(update_batch_size=True):", episode.batch_size, episode["info"].batch_size)


def nesting() -> None:
    section("Nesting TensorDicts")
    data = TensorDict({
        "key 1": torch.ones(3, 4, 5),
        "key 2": TensorDict({"sub-key": torch.randn(3, 4, 5, 6)}, batch_size=[3, 4, 5]),
    }, batch_size=[3, 4])
    tensordict_flatten = data.flatten_keys(separator=".")
    print("flat keys:", list(tensordict_flatten.keys()))
    sub_value = data["key 2", "sub-key"]
    print("data['key 2', 'sub-key'].shape:", sub_value.shape)


def tensor_like() -> None:
    section("Tensor-like features")
    td = TensorDict.fromkeys(["a", "b", "c"], 0)
    td += 1
    assert (td == 1).all()
    data = TensorDict({"key 1": torch.ones(3, 4, 5), "key 2": torch.zeros(3, 4, 5, dtype=torch.bool)},
                      batch_size=[3, 4])
    sub_tensordict = data[..., :2]
    assert sub_tensordict.shape == torch.Size([3, 2])
    assert sub_tensordict["key 1"].shape == torch.Size([3, 2, 5])
    tensordicts = [TensorDict({"key 1": torch.ones(3, 4, 5), "key 2": torch.zeros(3, 4, 5, dtype=torch.bool)},
                              batch_size=[3, 4]) for _ in range(2)]
    stack_tensordict = torch.stack(tensordicts, 1)
    assert stack_tensordict.shape == torch.Size([3, 2, 4])
    assert stack_tensordict["key 1"].shape == torch.Size([3, 2, 4, 5])
    cat_tensordict = torch.cat(tensordicts, 0)
    assert cat_tensordict.shape == torch.Size([6, 4])
    assert cat_tensordict["key 1"].shape == torch.Size([6, 4, 5])
    print("stack:", stack_tensordict.shape, "cat:", cat_tensordict.shape)
    # Episodes of different lengths, padded into one batch with a mask of the real steps.
    episodes = [TensorDict({"reward": torch.ones(length)}, batch_size=[length]) for length in (3, 5)]
    padded = pad_sequence(episodes, return_mask=True)
    print("pad_sequence:", padded.batch_size, padded["masks", "reward"].int().tolist())
    # Or keep ragged entries as they are: a lazy stack holds the TensorDicts and stacks on demand.
    lazy = lazy_stack([TensorDict(reward=torch.ones(length)) for length in (3, 5)])
    print("lazy_stack:", lazy.batch_size, "rewards:", [r.shape[0] for r in lazy.get("reward", as_list=True)],
          "padded:", lazy.get("reward", as_padded_tensor=True).shape)
    # Member-wise ops keep it lazy: arithmetic, select, update act on each TensorDict in the stack.
    scaled = (lazy * 2).select("reward")
    print("lazy * 2:", type(scaled).__name__, [r.sum().item() for r in scaled.get("reward", as_list=True)],
          "| sum over all 8 steps:", lazy.sum(reduce=True).item())
    # The guide prints the shapes of these results.
    print(data.view(-1).shape)
    print(data.reshape(-1).shape)
    print(data.unsqueeze(-1).shape)
    tensordict_uniform = data.apply(lambda tensor: tensor.float().uniform_())
    scores = TensorDict({"logits": torch.tensor([[0.0, 1.0], [2.0, 3.0]])}, batch_size=[2])
    print("logsumexp over the batch:", scores.logsumexp()["logits"], "| median:", scores.quantile(0.5)["logits"])
    print("softmax over the batch:", scores.softmax(0)["logits"][:, 0], "| dtype:", scores.dtype, "| depth:", data.depth)
    weights = TensorDict(w=torch.ones(3, requires_grad=True), batch_size=[3])
    (weights["w"] * 2).sum().backward()
    print("grad of each leaf:", weights.grad["w"])
    print("uniform mean in [0, 1]:", bool(0 <= tensordict_uniform["key 1"].mean() <= 1))
    data = TensorDict({"a": torch.tensor(1.0, dtype=torch.float), "b": torch.tensor(1, dtype=torch.int64)}, [])
    data_float = data.apply(lambda x: x if x.dtype == torch.float else None)
    assert "b" not in data_float
    print("apply as a filter kept:", list(data_float.keys()))


def context_managers() -> None:
    section("TensorDicts as context managers")
    td = TensorDict({"a": {"b": 0}})
    with td.flatten_keys() as tdflat:
        tdflat["a.b"] += 1
        tdflat["a.c"] = 0
    assert td["a", "b"] == 1
    assert td["a", "c"] == 0
    print("after the block: a.b =", td["a", "b"].item(), " a.c =", td["a", "c"].item())


def _distributed_worker(rank: int, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    data = TensorDict({"a": torch.zeros(()), ("b", "c"): torch.ones(())}, [])
    if rank == 1:
        data["a"] += 41
        data.isend(dst=0)
        data.consolidate().send(dst=0, consolidated=True)  # one buffer, one message (upstream's protocol)
    else:
        data.irecv(src=1)
        print("worker 0 received a =", data["a"].item(), " b.c =", data["b", "c"].item())
        inbox = TensorDict({"a": torch.zeros(()), ("b", "c"): torch.zeros(())}, []).consolidate(metadata=True)
        inbox.recv(src=1, consolidated=True)  # into its consolidated storage: every leaf at once
        print("consolidated recv: a =", inbox["a"].item(), " b.c =", inbox["b", "c"].item())
    dist.destroy_process_group()


def distributed() -> None:
    section("Distributed capabilities")
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_distributed_worker, args=(port,), nprocs=2, start_method="spawn")


def state_dicts() -> None:
    section("TensorDict to represent state-dicts")
    module = torch.nn.Sequential(torch.nn.Linear(3, 4))
    state_dict = TensorDict.from_module(module)
    print(state_dict)
    state_dict.data.zero_()
    state_dict.to_module(module, inplace=True)
    print("module weights are zero:", bool((module[0].weight == 0).all()))
    # state_dict() uses nn.Module's dotted keys, so a module's own checkpoint loads into it.
    restored = TensorDict()
    restored.load_state_dict(module.state_dict(), strict=False)  # strict: the key sets must match
    print("loaded from module.state_dict():", sorted(restored.state_dict()))
    # TensorDictParams: the same leaves as an nn.Module, so optimizers and .to() see them.
    params = TensorDictParams(TensorDict.from_module(module))
    print("TensorDictParams parameters:", [name for name, _ in params.named_parameters()])


def functional() -> None:
    section("TensorDict for functional programming")
    module = torch.nn.Sequential(torch.nn.Linear(3, 4))
    td = TensorDict.from_module(module)
    td_zero = td.detach().clone().zero_()
    with td_zero.to_module(module):
        y = module(torch.randn(3))
    assert (y == 0).all()
    print("output with zeroed parameters:", y)
    td_one = td.detach().clone() * 0 + 1
    td_stack = torch.stack([td_zero, td_one])

    def call_module(x, td):
        with td.to_module(module):
            return module(x)

    x = torch.ones(2, 10, 3)
    y = torch.vmap(call_module)(x, td_stack)
    assert (y[0] == 0).all()
    assert (y[1] == 4).all()
    print("vmap over two parameter sets: y[0] == 0, y[1] == 4:", bool((y[0] == 0).all() and (y[1] == 4).all()))


def serialization(workdir: str) -> None:
    section("Parameter serialization and datasets")
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 3))
    params = TensorDict.from_module(model)
    folder = os.path.join(workdir, "saved")
    params.memmap(folder, num_threads=16)
    params = TensorDict.load_memmap(folder, num_threads=16)
    params.to_module(model)
    params["0"].to_module(model[0])
    params0 = TensorDict.load_memmap(os.path.join(folder, "0"), num_threads=16)
    params0.to_module(model[0])
    print("saved files:", sorted(os.listdir(os.path.join(folder, "0"))))

    data = TensorDict({
        "images": torch.zeros((128, 128, 3), dtype=torch.uint8),
        "labels": torch.zeros((), dtype=torch.int)}, batch_size=[])
    size = int(os.environ.get("TORCHDICT_TOUR_DATASET_SIZE", 1_000_000))
    data = data.expand(size)
    data = data.memmap_like(os.path.join(workdir, "dataset"))
    items = data[torch.tensor([1, size // 100, size // 2])]
    print(f"dataset of {size} images allocated on disk; 3 items:", items.batch_size,
          "images are", type(data["images"]).__name__)


@tensorclass
class MyData:
    image: torch.Tensor
    mask: torch.Tensor
    label: torch.Tensor

    def mask_image(self):
        return self.image[self.mask.expand_as(self.image)].view(*self.batch_size, -1)

    def select_label(self, label):
        return self[self.label == label]


def lazy_preallocation() -> None:
    section("Lazy preallocation")

    def foo():
        data = TensorDict({}, batch_size=[])
        data["a"] = torch.randn(3)
        data["b"] = TensorDict({"c": torch.zeros(2)}, batch_size=[])
        return data

    N = 10
    stacked = torch.stack([foo() for _ in range(N)])
    data = TensorDict({}, batch_size=[N])
    for i in torch.randperm(N).tolist():
        data[i] = foo()
    print(data)
    assert stacked.batch_size == data.batch_size


def tensorclass_section() -> None:
    section("TensorClass")
    torch.manual_seed(0)
    images = torch.randn(100, 3, 64, 64)
    label = torch.randint(10, (100,))
    mask = torch.zeros(1, 64, 64, dtype=torch.bool).bernoulli_().expand(100, 1, 64, 64)
    data = MyData(images, mask, label=label, batch_size=[100])
    print(data.select_label(1))
    print(data.mask_image().shape)
    print(data.reshape(10, 10))
    # Conversions: a nested dict in, a plain TensorDict copy out.
    rebuilt = MyData.from_dict(data[:2].to_dict(), batch_size=[2])
    assert torch.equal(rebuilt.label, data.label[:2])
    print("from_dict(to_dict()):", type(rebuilt).__name__, rebuilt.batch_size, "->",
          type(rebuilt.to_tensordict()).__name__)


def preprocessing(workdir: str) -> None:
    section("Preprocessing with TensorDict.map")
    from preprocess_map import process_data

    data = TensorDict({
        "images": torch.randint(0, 255, (16, 8, 8, 3), dtype=torch.uint8),
        "labels": torch.arange(16) * 10}, batch_size=[16]).memmap_(os.path.join(workdir, "preproc"))
    before = data["images"].clone()
    data.map(process_data, num_workers=2, chunksize=0)
    assert torch.equal(data["images"], before.flip(-2)) and torch.equal(data["labels"], torch.arange(16))
    print("images flipped and labels clustered in place by 2 workers:", data["labels"].tolist())


def _sleeps_too_long(chunk: TensorDict) -> None:
    import time

    time.sleep(60)  # a hung fn: map's timeout ends it


def reliability(workdir: str) -> None:
    section("Reliability: failed calls, timeouts, crash-safe saves, planted links")
    td = TensorDict({"obs": torch.zeros(4, 3), "act": torch.zeros(4)}, batch_size=[4])
    try:
        td.update({"obs": torch.ones(4, 3), "act": torch.ones(5)})  # "act" has the wrong batch
    except RuntimeError:
        print("update refused; obs untouched:", not td["obs"].any())
    try:
        td.map(_sleeps_too_long, num_workers=1, timeout=0.5)
    except TimeoutError as error:
        print("TimeoutError:", str(error).split(" (")[0])
    ckpt = os.path.join(workdir, "ckpt")
    for step in (1, 2):  # a save over a save is written beside it, then swapped in atomically
        TensorDict(step=torch.tensor(step)).memmap(ckpt)
    print("ckpt holds step", TensorDict.load_memmap(ckpt)["step"].item())
    os.remove(os.path.join(ckpt, "step.memmap"))
    os.symlink(os.devnull, os.path.join(ckpt, "step.memmap"))  # a link planted in the folder
    try:
        TensorDict.load_memmap(ckpt)
    except RuntimeError as error:
        print("RuntimeError:", str(error).split(" inside")[0].replace(workdir, "<workdir>"))


def non_tensor_data() -> None:
    section("Non-tensor data")
    from torchdict import NonTensorData, NonTensorStack

    names = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
    print(names[1, 0].data, names.permute(1, 0).tolist())
    tag = NonTensorData("run-1", batch_size=[2, 2])
    print(torch.stack([tag, tag]).batch_size, bool((tag == NonTensorData("run-1")).all()))


def nested_batches() -> None:
    section("Nested levels with batch dims of their own")
    # Each level may add batch dims to its parent's; every batch op keeps them, at any depth.
    inner = TensorDict({"k": torch.zeros(3, 2)}, batch_size=[3, 2])
    td = TensorDict({"n": TensorDict({"m": inner}, batch_size=[3, 2])}, batch_size=[3])
    print("td[0]:", td[0]["n", "m"].batch_size, "| stacked:", torch.stack([td, td], 1)["n", "m"].batch_size)


def collections() -> None:
    section("One API for every kind of collection (TensorDictBase)")
    members = [TensorDict({"obs": torch.full((2,), float(i))}, batch_size=[2]) for i in range(3)]
    stacked = lazy_stack(members)  # keeps its members; they may even differ in shape
    print(isinstance(stacked, TensorDictBase), stacked.reshape(-1)["obs"].tolist())
    stacked.clamp_(max=1.0)  # an in-place op writes into the members
    print("members after clamp_:", [member["obs"].tolist() for member in members])
    ragged = lazy_stack([TensorDict(obs=torch.zeros(3, i + 1), batch_size=[3]) for i in range(2)], dim=1)
    print("ragged lazy stack:", type(ragged.view(-1)).__name__, ragged.view(-1).batch_size,
          "| padded:", ragged.get("obs", as_padded_tensor=True).shape)
    # Episodes of different lengths: the members' batch sizes differ, the stack's has -1 there.
    episodes = lazy_stack([TensorDict(reward=torch.ones(n, 1), batch_size=[n]) for n in (5, 3, 7)])
    print("episodes:", episodes.batch_size, "| returns:", [ep["reward"].sum().item() for ep in episodes.unbind(0)],
          "| first steps:", episodes[:, 0].batch_size)


def nn_modules() -> None:
    section("Modules: an actor-critic from TensorDictModule and TensorDictSequential")
    from torchdict.nn import TensorDictModule, TensorDictSequential

    class QValue(nn.Module):  # the critic reads two entries: the features and the action
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16 + 2, 32), nn.Tanh(), nn.Linear(32, 1))

        def forward(self, hidden: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
            return self.net(torch.cat([hidden, action], -1))

    torch.manual_seed(0)
    encoder = TensorDictModule(nn.Sequential(nn.Linear(4, 16), nn.Tanh()), in_keys=["observation"],
                               out_keys=["hidden"])
    actor = TensorDictModule(nn.Sequential(nn.Linear(16, 2), nn.Tanh()), in_keys=["hidden"], out_keys=["action"])
    critic = TensorDictModule(QValue(), in_keys=["hidden", "action"], out_keys=[("critic", "value")])
    agent = TensorDictSequential(encoder, actor, critic)
    print("agent reads", agent.in_keys, "and writes", agent.out_keys)
    policy = agent.select_subsequence(out_keys=["action"]).select_out_keys("action")
    print(f"policy: {len(policy)} of the {len(agent)} modules, writes {policy.out_keys}")

    # Synthetic task: the reward is highest when the action matches a fixed linear map of the observation.
    target_map = torch.randn(4, 2)
    observations = torch.randn(256, 4)
    batch = TensorDict(observation=observations, batch_size=[256])
    critic_optim = torch.optim.Adam(critic.parameters(), lr=1e-2)
    actor_optim = torch.optim.Adam(list(actor.parameters()) + list(encoder.parameters()), lr=1e-2)

    def reward(data: TensorDict) -> torch.Tensor:
        return -((data["action"] - torch.tanh(data["observation"] @ target_map)) ** 2).sum(-1, keepdim=True)

    first_critic_loss = first_return = None
    for step in range(60):
        data = agent(batch.clone())
        # critic: regress the reward of the actions taken (actor and encoder held fixed)
        critic_loss = ((critic(data.detach())["critic", "value"] - reward(data).detach()) ** 2).mean()
        critic_optim.zero_grad()
        critic_loss.backward()
        critic_optim.step()
        # actor: follow the critic's value of its own action
        actor_loss = -agent(batch.clone())["critic", "value"].mean()
        actor_optim.zero_grad()
        actor_loss.backward()
        actor_optim.step()
        if step == 0:
            first_critic_loss, first_return = critic_loss.item(), reward(data).mean().item()
    data = agent(batch.clone())
    print("keys written:", sorted(data.keys(include_nested=True, leaves_only=True), key=str))
    print("critic loss went down:", critic_loss.item() < first_critic_loss)
    print("true reward went up:", reward(data).mean().item() > first_return)
    print("policy called with a tensor:", tuple(policy(torch.zeros(3, 4)).shape))


def probabilistic_policy() -> None:
    section("Probabilistic modules")
    from torch import distributions as d

    from torchdict.nn import TensorDictModule
    from torchdict.nn.distributions import NormalParamExtractor
    from torchdict.nn.probabilistic import (
        ProbabilisticTensorDictModule,
        ProbabilisticTensorDictSequential,
        set_interaction_type,
    )

    torch.manual_seed(0)
    policy = ProbabilisticTensorDictSequential(
        TensorDictModule(torch.nn.Linear(3, 4), in_keys=["observation"], out_keys=["params"]),
        TensorDictModule(NormalParamExtractor(), in_keys=["params"], out_keys=["loc", "scale"]),
        ProbabilisticTensorDictModule(
            in_keys=["loc", "scale"], out_keys=[("agent", "action")],
            distribution_class=d.Normal, return_log_prob=True,
        ),
    )
    data = TensorDict(observation=torch.randn(5, 3), batch_size=[5])
    with set_interaction_type("deterministic"):
        greedy = policy(data.copy())
    print("keys:", sorted(str(key) for key in greedy.keys(True, True)))
    print("greedy action is the mean:", torch.equal(greedy["agent", "action"], greedy["loc"]))
    torch.manual_seed(1)
    with set_interaction_type("random"):
        sampled = policy(data.copy())
    print("action", tuple(sampled["agent", "action"].shape),
          "log-prob", tuple(sampled["agent", "action_log_prob"].shape))
    print("first action:", [round(v, 4) for v in sampled["agent", "action"][0].tolist()])
    print("log_prob recomputed:", torch.allclose(policy.log_prob(sampled), sampled["agent", "action_log_prob"]))
    print("distribution:", policy.get_dist(data))


def compile_and_devices() -> None:
    section("torch.compile and device transfer")
    torch.manual_seed(0)
    td = TensorDict(obs=torch.randn(4, 3), next={"reward": torch.ones(4)}, batch_size=[4])

    def step(td):
        out = (td[1:] * 2).apply(torch.relu)
        out["total"] = out["obs"].sum(-1) + out["next", "reward"]
        return torch.stack([out, out.clone()])

    compiled = torch.compile(step, fullgraph=True, backend="eager")  # traced whole: no graph break
    out = compiled(td)
    print("compiled step:", out.batch_size, list(out.keys(True, True)))
    print("equals eager:", bool((out["total"] == step(td)["total"]).all()))
    packed = td.consolidate()  # every leaf a view into one byte buffer (upstream's layout)
    print("consolidated:", packed.is_consolidated(), "locked:", packed.is_locked,
          "bytes:", packed._consolidated["storage"].numel())
    moved = packed.to("meta")  # one copy of the buffer ("cuda" on a GPU, with non_blocking=True)
    print("moved:", moved.device, moved.is_consolidated(), moved["next", "reward"].device)
    print("to where the leaves are, no copy:", td.to("cpu")["obs"] is td["obs"])

    def update(td, t):
        td -= t  # in place under torch.compile too: td itself changes, as in eager Python
        return td ** t, t - td  # operators with a plain tensor, on either side

    target = td.clone()
    powers, _ = torch.compile(update, fullgraph=True, backend="eager")(target, torch.full((4,), 2.0))
    print("compiled td -= t in place:", torch.equal(target["obs"], td["obs"] - 2), "| td ** t:", powers.batch_size)
    images = TensorDict(image=torch.randn(2, 3, 4, 5), batch_size=[2])
    cl = images.to(memory_format=torch.channels_last)  # 4-D and 5-D leaves, as nn.Module.to
    print("channels_last:", cl["image"].is_contiguous(memory_format=torch.channels_last),
          "| to(other=...):", images.to(other=TensorDict(x=torch.zeros(1, dtype=torch.float16)))["image"].dtype)


def dropin() -> None:
    section("Drop-in: upstream's toggles, print options and helpers")
    import warnings

    import torchdict
    from torchdict import TypedTensorDict, set_printoptions

    td = TensorDict(obs=torch.arange(6.0).view(3, 2), done=torch.zeros(3, dtype=torch.bool), batch_size=[3])
    with set_printoptions(compact=True):
        print(td)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with torchdict.set_list_to_stack(False):
            td["tags"] = ["a", "b", "c"]
    print(type(td.get("tags")).__name__, td["tags"].tolist())
    print(td.float64(cast_filter=torchdict.is_inexact)["done"].dtype)
    print(td.add(TensorDict(obs=torch.ones(3, 2), reward=torch.ones(3), batch_size=[3]),
                 default="intersection")["obs"][:, 0].tolist())
    print(td.exclude("tags").unsqueeze(0).rot90()["obs"].shape)

    class State(TypedTensorDict):
        obs: torch.Tensor
        done: torch.Tensor

    state = State.from_tensordict(td.exclude("tags"))
    print(type(state[0]).__name__, state.obs[1].tolist())
    values, groups = torchdict.group_by(TensorDict(uid=torch.tensor([1, 0, 1]), x=torch.arange(3), batch_size=[3]),
                                        "uid")
    print(values.tolist(), [group["x"].tolist() for group in groups])


def dropin_classes() -> None:
    section("Drop-in: linked lists, lazy stacks of tensors, unpadding, futures")
    import torchdict
    from torchdict.utils import LinkedList, TensorDictFuture

    td = TensorDict(batch_size=[3])
    td["names"] = ["a", "b", "c"]
    names = td["names"]  # a LinkedList: writing an item writes the stack
    names[0] = "z"
    print(isinstance(names, LinkedList), td.get("names").tolist())
    print(torchdict.LazyStackedTensorDict.lazy_stack([torch.ones(1), torch.ones(3)], as_padded_tensor=True,
                                                      padding_side="left").tolist())
    samples = [TensorDict(x=torch.full((n, 2), float(n)), batch_size=[n, 2]) for n in (1, 3)]
    padded = torchdict.pad_sequence(samples, return_mask=True)  # the padded dim is a batch dim
    print("unpadded:", [tuple(sample.batch_size) for sample in torchdict.unpad_sequence(padded).tensordicts])
    folder = tempfile.mkdtemp()
    try:
        future = TensorDict(a=torch.arange(3.0), batch_size=[3]).memmap(folder, num_threads=2, return_early=True)
        print(isinstance(future, TensorDictFuture), future.result()["a"].tolist())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def shared_non_tensor() -> None:
    section("Shared non-tensor values and lazy-stack archives")
    import pickle
    import zipfile

    import torchdict
    from torchdict import NonTensorData

    folder = tempfile.mkdtemp()
    try:
        buffer = TensorDict(obs=torch.zeros(3, 2), task=NonTensorData("walk", batch_size=[3]), batch_size=[3])
        buffer = buffer.memmap(os.path.join(folder, "buffer"), share_non_tensor=True)
        worker_copy = pickle.loads(pickle.dumps(buffer))  # what a (spawned) worker process receives
        worker_copy.set_("task", NonTensorData("run", batch_size=[3]))  # written in the worker...
        print("read here:", buffer["task"])  # ...read in the parent
        print("in the folder:", torchdict.load(os.path.join(folder, "buffer"))["task"])
        try:
            worker_copy[0] = worker_copy[0].clone().set("task", "jump")
        except RuntimeError as error:
            print("one value per batch:", str(error).split(",")[0])
        ragged = lazy_stack([TensorDict(a=torch.zeros(2)), TensorDict(a=torch.arange(3.0))])
        saved = ragged.memmap(os.path.join(folder, "ragged.tdz"))  # one archive file, not a folder of members
        print("archive:", zipfile.is_zipfile(os.path.join(folder, "ragged.tdz")), type(saved).__name__,
              [member["a"].tolist() for member in saved.tensordicts])
        flat, layout = lazy_stack([TensorDict(x=torch.ones(2)), TensorDict(x=torch.zeros(2))]).pack()
        print("lazy pack:", tuple(flat.shape), layout.keys)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def unbatched_and_metadata() -> None:
    section("Entries for the whole batch: UnbatchedTensor and MetaData")
    from torchdict import MetaData, UnbatchedTensor

    config = {"lr": 0.1}
    td = TensorDict(obs=torch.zeros(4, 3), table=UnbatchedTensor(torch.arange(6.0).view(2, 3)),
                    config=MetaData(config, batch_size=[4]), batch_size=[4])
    row = td[1]  # the batch ops leave the table alone: same data, the row's batch size
    print("table:", tuple(row["table"].shape), tuple(row["table"].batch_size),
          row["table"].data_ptr() == td["table"].data_ptr())
    stacked = torch.stack([td, td])
    print("stacked:", tuple(stacked["table"].batch_size), type(stacked.get("config")).__name__,
          stacked["config"] is config)
    copies = td.exclude("table")
    print("after clone:", type(torch.stack([copies, copies.clone()]).get("config")).__name__)  # another object
    print("applied:", type((td + 1)["table"]).__name__, (td + 1)["table"][0].tolist())
    try:
        MetaData[str](1)
    except TypeError as err:
        print("MetaData[str]:", err)


def main() -> None:
    workdir = tempfile.mkdtemp(prefix="torchdict-tour-")
    try:
        basic_usage()
        metadata()
        specialised_dictionary()
        nesting()
        tensor_like()
        context_managers()
        distributed()
        state_dicts()
        functional()
        serialization(workdir)
        preprocessing(workdir)
        lazy_preallocation()
        tensorclass_section()
        nested_batches()
        collections()
        non_tensor_data()
        reliability(workdir)
        nn_modules()
        probabilistic_policy()
        hdf5_and_zarr()
        tables_and_files()
        tensorclass_readers()
        archives()
        shared_non_tensor()
        store()
        compile_and_devices()
        dropin()
        dropin_classes()
        unbatched_and_metadata()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nThe tour ran to the end.")


if __name__ == "__main__":
    main()

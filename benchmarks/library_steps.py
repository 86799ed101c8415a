"""Train steps of models that libraries ship, each with the sharding plan that library ships
for it, for benchmarks/libraries.py.

A builder returns a `LibraryStep`: the pure step `fn(params, opt_state, batch)`, its
random-initialised arguments (small sizes, nothing downloaded), the mesh, the library's plan
as a pytree of PartitionSpecs shaped like the arguments, and the schedule partir searches.
Optimizer moments take their parameter's spec, as the libraries' trainers place them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from partir import strategies as st

MEGATRON_MESH = {"data": 2, "model": 4}
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples" / "ecosystem"


@dataclasses.dataclass
class LibraryStep:
    fn: Callable
    args: tuple
    mesh: dict[str, int]
    library_specs: Any  # pytree of PartitionSpec shaped like args
    schedule: list
    library_plan: str  # what the library's plan is, in a few words
    note: str = ""
    jax_mesh: Any = None  # the library's own jax Mesh, if it makes one (else one is made)
    # entered while tracing, lowering and compiling (e.g. the library's logical axis rules)
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # the library's own jax.jit of fn (its in/out shardings and donation); else one is made
    # from library_specs with carried outputs sharded as their inputs, the state donated
    library_jit: Callable[[], Any] | None = None


def nest_paths(flat: dict[str, Any]) -> dict:
    """{"a/b": x} -> {"a": {"b": x}}."""
    out: dict = {}
    for path, x in flat.items():
        *outer, leaf = path.split("/")
        node = out
        for key in outer:
            node = node.setdefault(key, {})
        node[leaf] = x
    return out


def get_path(tree: dict, path: str) -> Any:
    for key in path.split("/"):
        tree = tree[key]
    return tree


def moment_specs(tx, opt_state, param_specs):
    """Specs of an optax state: each moment its parameter's spec, counters replicated."""
    import optax

    return optax.tree_map_params(
        tx, lambda _, spec: spec, opt_state, param_specs, transform_non_params=lambda _: P()
    )


def lm_loss(logits, tokens):
    """Next-token cross-entropy (f32) of logits [batch, seq, vocab] against tokens."""
    import optax

    logits = logits[:, :-1].astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


# -- penzai ------------------------------------------------------------------------------
PENZAI_MEGATRON = {
    "batch": "data",
    "neurons": "model",
    "heads": "model",
    "query_heads": "model",
    "head_groups": "model",
}


def penzai_step(variant: str, *, batch=16, seq=64, seed=0) -> LibraryStep:
    """A penzai transformer (llama-like, gemma-like or GPT-NeoX) at a small size, trained
    with optax.adamw on next-token loss; penzai's plan is `name_to_name_sharding` of its
    named axes, Megatron style (neurons and heads on `model`, batch on `data`)."""
    import optax
    from penzai import pz
    from penzai.models.transformer.variants import gpt_neox, llamalike_common
    from penzai.toolshed import sharding_util

    vocab = 512
    common = dict(embedding_dim=128, mlp_hidden_dim=512, num_decoder_blocks=2, vocab_size=vocab)
    if variant == "llama":
        config = llamalike_common.LlamalikeTransformerConfig(
            num_kv_heads=4,
            query_head_multiplier=1,
            projection_dim=32,
            mlp_variant="swiglu",
            tie_embedder_and_logits=False,
            **common,
        )
        model = llamalike_common.build_llamalike_transformer(config, jax.random.key(seed))
    elif variant == "gemma":  # Gemma 2B's shape: multi-query attention, tied embeddings
        config = llamalike_common.LlamalikeTransformerConfig(
            num_kv_heads=1,
            query_head_multiplier=8,
            projection_dim=16,
            mlp_variant="geglu_approx",
            tie_embedder_and_logits=True,
            **common,
        )
        model = llamalike_common.build_llamalike_transformer(config, jax.random.key(seed))
    else:
        config = gpt_neox.GPTNeoXTransformerConfig(
            num_attention_heads=4,
            projection_dim=32,
            activation_fn="gelu_exact",
            rope_subset_size=8,
            rope_wavelength=10_000.0,
            layernorm_epsilon=1e-5,
            parameter_dtype=jnp.float32,
            activation_dtype=jnp.float32,
            **common,
        )
        model = gpt_neox.build_gpt_neox_transformer(config, jax.random.key(seed))

    unbound, values = pz.unbind_params(model, freeze=True)
    axes = {v.label: tuple(v.value.named_axes) for v in values}
    tx = optax.adamw(1e-3)

    def bind(params):
        return pz.bind_variables(
            unbound,
            [
                dataclasses.replace(
                    v, value=pz.nx.wrap(get_path(params, v.label)).tag(*axes[v.label])
                )
                for v in values
            ],
        )

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            tokens = pz.nx.wrap(batch["tokens"]).tag("batch", "seq")
            logits = bind(p)(tokens).untag("batch", "seq", "vocabulary").unwrap()
            return lm_loss(logits, batch["tokens"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}

    params = nest_paths({v.label: v.value.unwrap(*axes[v.label]) for v in values})
    tokens = jax.random.randint(jax.random.key(seed + 1), (batch, seq), 0, vocab)
    data = {"tokens": tokens}
    opt_state = tx.init(params)

    # penzai's own plan: its name-to-name sharding of the parameters' named axes
    mesh = jax.sharding.Mesh(jax.devices()[:8], ("flat",))  # only the axis names matter here
    named = sharding_util.name_to_name_sharding(
        [v.value for v in values], mesh, {k: "flat" for k in PENZAI_MEGATRON if k != "batch"}
    )
    param_specs = nest_paths(
        {
            v.label: P(*["model" if e else None for e in s.data_array.spec])
            for v, s in zip(values, named)
        }
    )
    specs = (param_specs, moment_specs(tx, opt_state, param_specs), {"tokens": P("data")})
    return LibraryStep(
        train_step,
        (params, opt_state, data),
        MEGATRON_MESH,
        specs,
        [st.batch("data"), st.megatron("model")],
        "penzai name_to_name_sharding: neurons, heads -> model; batch -> data",
    )


# -- keras-hub ---------------------------------------------------------------------------
def _keras():
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError("keras was imported with another backend; set KERAS_BACKEND=jax")
    return keras


def gpt2_layout_map(mesh, model="model", data="batch"):
    """A LayoutMap for GPT2Backbone in the form of keras-hub's Llama/Gemma `get_layout_map`
    (keras-hub ships none for GPT-2): embeddings (None, model); query/key/value kernels
    (None, model, None); attention output (model, None, None); intermediate (None, model);
    output (model, None)."""
    keras = _keras()
    layout = keras.distribution.LayoutMap(mesh)
    layout["token_embedding/embeddings"] = (model, None)
    layout["position_embedding/embeddings"] = (None, None)
    layout[".*(query|key|value)/kernel"] = (None, model, None)
    layout[".*(query|key|value)/bias"] = (model, None)
    layout[".*attention_output/kernel"] = (model, None, None)
    layout[".*intermediate_dense/kernel"] = (None, model)
    layout[".*intermediate_dense/bias"] = (model,)
    layout[".*output_dense/kernel"] = (model, None)
    del data
    return layout


def keras_hub_step(variant: str, *, batch=16, seq=64, seed=0) -> LibraryStep:
    """A keras-hub causal LM backbone (Llama, Gemma or GPT-2) at a small size, its
    `stateless_call` under optax.adamw on next-token loss; keras-hub's plan is the
    backbone's `get_layout_map` (GPT-2 has none: see `gpt2_layout_map`) under
    `keras.distribution.ModelParallel` with the batch on `data`."""
    keras = _keras()
    import keras_hub
    import optax

    keras.utils.set_random_seed(seed)
    vocab = 512
    if variant == "llama":
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=vocab,
            num_layers=2,
            num_query_heads=4,
            hidden_dim=128,
            intermediate_dim=512,
            num_key_value_heads=4,
        )
        causal = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    elif variant == "gemma":  # Gemma 7B's shape (multi-head): keras-hub's layout map
        backbone = keras_hub.models.GemmaBackbone(
            vocabulary_size=vocab,
            num_layers=2,
            num_query_heads=4,
            num_key_value_heads=4,
            hidden_dim=128,
            intermediate_dim=512,
            head_dim=32,
        )
        causal = keras_hub.models.GemmaCausalLM(backbone, preprocessor=None)
    else:
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=vocab,
            num_layers=2,
            num_heads=4,
            hidden_dim=128,
            intermediate_dim=512,
            max_sequence_length=seq,
        )
        causal = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)

    device_mesh = keras.distribution.DeviceMesh(
        (2, 4), ("batch", "model"), devices=keras.distribution.list_devices()[:8]
    )
    if variant == "gpt2":
        layout, plan = gpt2_layout_map(device_mesh), "LayoutMap in keras-hub's form (none shipped)"
    else:
        layout = type(backbone).get_layout_map(
            device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch"
        )
        plan = f"{type(backbone).__name__}.get_layout_map + ModelParallel"

    variables = causal.trainable_variables
    names = [v.path for v in variables]
    non_trainable = [v.value for v in causal.non_trainable_variables]
    tx = optax.adamw(1e-3)

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            inputs = {"token_ids": batch["tokens"], "padding_mask": jnp.ones_like(batch["tokens"])}
            logits, _ = causal.stateless_call(
                [get_path(p, n) for n in names], non_trainable, inputs, training=True
            )
            return lm_loss(logits, batch["tokens"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}

    params = nest_paths({v.path: v.value for v in variables})
    tokens = jax.random.randint(jax.random.key(seed + 1), (batch, seq), 0, vocab)

    def spec(v) -> P:
        found = layout[v.path]
        if found is None:
            return P()
        return P(*[{"batch": "data"}.get(a, a) for a in found.axes])

    param_specs = nest_paths({v.path: spec(v) for v in variables})
    opt_state = tx.init(params)
    specs = (param_specs, moment_specs(tx, opt_state, param_specs), {"tokens": P("data")})
    return LibraryStep(
        train_step,
        (params, opt_state, {"tokens": tokens}),
        MEGATRON_MESH,
        specs,
        [st.batch("data"), st.megatron("model")],
        plan,
        note=f"keras {keras.__version__}, keras-hub {keras_hub.__version__}; optax adamw",
    )


# -- jraph -------------------------------------------------------------------------------
GRAPH_EDGE_FIELDS = ("edges", "senders", "receivers")


def jraph_gns_step(*, graphs=8, nodes=64, edges=256, seed=0) -> LibraryStep:
    """The jraph GraphNetwork encode-process step of examples/ecosystem/jraph_gnn.py;
    jraph's plan is that of `jraph.experimental.sharded_graphnet`: the edges (features,
    senders, receivers) split over the devices, nodes, globals and parameters replicated."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import jraph_gnn

    fn, (params, opt_state, data) = jraph_gnn.train_step_and_args(
        graphs=graphs, nodes=nodes, edges=edges, seed=seed
    )
    rep = lambda tree: jax.tree.map(lambda _: P(), tree)  # noqa: E731
    graph = data["graph"]
    graph_specs = graph._replace(
        **{f: P("devices") for f in GRAPH_EDGE_FIELDS},
        **{f: P() for f in graph._fields if f not in GRAPH_EDGE_FIELDS},
    )
    specs = (rep(params), rep(opt_state), {"graph": graph_specs, "target": P()})
    return LibraryStep(
        fn,
        (params, opt_state, data),
        {"devices": 8},
        specs,
        [st.auto("devices")],
        "jraph sharded_graphnet: edges split, nodes and parameters replicated",
    )


# -- MaxText -----------------------------------------------------------------------------
MAXTEXT_SMALL = [
    "override_model_config=True",
    "base_emb_dim=128",
    "base_mlp_dim=512",
    "base_moe_mlp_dim=512",
    "base_num_decoder_layers=2",
    "head_dim=32",
    "vocab_size=512",
    "per_device_batch_size=2",
    "max_target_length=64",
    # f32 activations: XLA:CPU carries bf16 collectives in f32, so with MaxText's default
    # bf16 its own jit (which gathers the f32 weights) and plan.jit (which reshards after
    # the bf16 converts) would not be measured alike here
    "dtype=float32",
]
MAXTEXT_MODELS = {
    "llama2": ["model_name=llama2-7b", "base_num_query_heads=4", "base_num_kv_heads=4"],
    "mistral": ["model_name=mistral-7b", "base_num_query_heads=4", "base_num_kv_heads=2"],
    # dense expert matmuls: megablox and ragged kernels are TPU/GPU only
    "mixtral": [
        "model_name=mixtral-8x7b",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "num_experts=4",
        "num_experts_per_tok=2",
        "sparse_matmul=False",
        "megablox=False",
        "capacity_factor=-1",
    ],
}
MAXTEXT_MESHES = {  # second axis: fsdp or expert; the first data, the third tensor
    "fsdp": ["ici_data_parallelism=2", "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2"],
    "expert": ["ici_data_parallelism=2", "ici_expert_parallelism=2", "ici_tensor_parallelism=2"],
}


def maxtext_step(variant: str, middle: str = "fsdp", *, output_dir: str | None = None):
    """MaxText's own pre-training step (trainers/pre_train/train.py's train_step, as its
    train_compile.py jits it: MaxText's state and data shardings from its logical axis
    rules, state donated) for a small llama2, mistral or mixtral config (f32 activations and
    weights, see MAXTEXT_SMALL; scanned and rematerialised layers, AdamW), on data x {fsdp|expert} x
    tensor. partir searches batch(data), then fsdp(fsdp) or expert(expert), then
    megatron(tensor)."""
    import tempfile

    import maxtext
    from flax.linen import partitioning as nn_partitioning
    from jax.sharding import AxisType, Mesh
    from maxtext.configs import pyconfig
    from maxtext.trainers.pre_train import train, train_compile
    from maxtext.utils import maxtext_utils, sharding

    base = str(pathlib.Path(maxtext.__file__).parent / "configs" / "base.yml")
    out = output_dir or tempfile.mkdtemp(prefix="maxtext-")
    argv = [
        "",
        base,
        *MAXTEXT_MODELS[variant],
        *MAXTEXT_SMALL,
        *MAXTEXT_MESHES[middle],
        "hardware=cpu",
        "skip_jax_distributed_system=True",
        "enable_checkpointing=False",
        "dataset_type=synthetic",
        "attention=dot_product",
        "enable_tensorboard=False",
        f"run_name={variant}",
        f"base_output_directory={out}",
    ]
    config = pyconfig.initialize(argv)
    devices = maxtext_utils.create_device_mesh(config, jax.devices()[:8])
    mesh = Mesh(devices, config.mesh_axes, axis_types=(AxisType.Auto,) * len(config.mesh_axes))
    rules = lambda: nn_partitioning.axis_rules(config.logical_axis_rules)  # noqa: E731
    with jax.set_mesh(mesh), rules():
        args, kwargs, state_sh, _, model = train_compile.get_shaped_inputs(mesh, config)
        params_sh, state_sh = sharding.maybe_update_params_sharding_with_opt(config, state_sh)
        in_state_sh = sharding.build_zero1_input_state_mesh_shardings(config, state_sh, params_sh)
        data_sh = sharding.get_input_data_sharding(config, mesh)
        fn, in_sh, out_sh, static, donate = maxtext_utils.get_functional_train_with_signature(
            train.train_step, data_sh, in_state_sh, model, config, params_sh
        )
    if static or kwargs:
        raise RuntimeError("MaxText's train step takes static or keyword arguments here")
    # the specs MaxText gives each argument leaf (a sharding may cover a whole subtree)
    specs = jax.tree_util.tree_map(
        lambda sh, sub: jax.tree.map(lambda _: sh.spec, sub), tuple(in_sh), tuple(args)
    )

    def library_jit():
        return jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=donate)

    def context():
        stack = contextlib.ExitStack()
        stack.enter_context(jax.set_mesh(mesh))
        stack.enter_context(rules())
        return stack

    second = st.fsdp("fsdp") if middle == "fsdp" else st.expert("expert")
    return LibraryStep(
        fn,
        tuple(args),
        {str(a): int(n) for a, n in mesh.shape.items()},
        specs,
        [st.batch("data"), second, st.megatron("tensor")],
        f"MaxText {variant} logical_axis_rules (base.yml), train_compile's jit",
        note=f"maxtext {getattr(maxtext, '__version__', '')}; dtype {config.dtype}, "
        f"weights {config.weight_dtype}",
        jax_mesh=mesh,
        context=context,
        library_jit=library_jit,
    )

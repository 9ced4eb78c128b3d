"""NeuMF (GMF + MLP) split into global item-side and local user-side layers.

One model instance represents one client: the local layers hold that client's
user embedding rows (one row each), the global layers hold everything the
server aggregates (item embedding tables, MLP tower, prediction layer).

The forward math lives in `neumf_logits`, shared by the Keras model and by
`score_items`, the batched scorer used to evaluate every user at once.
"""

from collections.abc import Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.sizes import ModelConfig  # pylint: disable=unused-import (re-exported)

EMBEDDING_STDDEV = 0.01


class UserEmbedding(tf.keras.layers.Layer):
    """The client's own user embedding: one row, broadcast over the batch."""

    def __init__(self, dim: int, *, seed: int | None = None, zeros: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        self.dim = dim
        self.seed = seed
        self.zeros = zeros

    def build(self, input_shape):
        self.embedding = self.add_weight(
            name='embedding',
            shape=(1, self.dim),
            initializer=('zeros' if self.zeros else tf.keras.initializers.RandomNormal(
                stddev=EMBEDDING_STDDEV, seed=self.seed
            )),
            trainable=True,
        )
        super().build(input_shape)

    def call(self, items):
        return tf.broadcast_to(self.embedding, [tf.shape(items)[0], self.dim])


def _linear(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """x @ kernel + bias; a rank-3 kernel `[G, in, out]` is one per user."""
    if len(kernel.shape) == 3:
        return tf.einsum('gli,gio->glo', x, kernel) + bias[:, tf.newaxis, :]
    return tf.tensordot(x, kernel, axes=1) + bias


def neumf_logits(
    user_gmf: tf.Tensor,
    user_mlp: tf.Tensor | None,
    item_gmf: tf.Tensor,
    item_mlp: tf.Tensor | None,
    tower: Sequence[tuple[tf.Tensor, tf.Tensor]],
    prediction: tuple[tf.Tensor, tf.Tensor],
    *,
    first_preactivation: tf.Tensor | None = None,
) -> tf.Tensor:
    """NeuMF logits from gathered embeddings; any leading batch shape.

    The dense weights are either shared or, with a leading user axis (rank-3
    kernels, inputs `[G, L, ...]`), one copy per user, as the vectorized
    client work needs for per-user SAM perturbations. `first_preactivation`,
    if given, replaces concat(user_mlp, item_mlp) @ kernel + bias of the first
    tower layer (a scorer can compute it as a per-user plus a per-item part).
    """
    features = user_gmf * item_gmf
    if tower:
        layers = tower
        if first_preactivation is None:
            hidden = tf.concat([user_mlp, item_mlp], axis=-1)
        else:
            hidden, layers = tf.nn.relu(first_preactivation), tower[1:]
        for kernel, bias in layers:
            hidden = tf.nn.relu(_linear(hidden, kernel, bias))
        features = tf.concat([features, hidden], axis=-1)
    kernel, bias = prediction
    return tf.squeeze(_linear(features, kernel, bias), axis=-1)


class NeuMF(tf.keras.Model):
    """NeuMF for one client. Input: item ids `[batch]`; output: logits `[batch]`.

    Layers: `global_layers` (item embeddings, tower, prediction) are shared and
    aggregated; `local_layers` (the user's embedding rows) stay on the client.
    """

    def __init__(self, config: ModelConfig, *, seed: int | None = None,
                 zero_local: bool = False, group_size: int | None = None,
                 **kwargs):
        """Builds every layer.

        Args:
          config: The model sizes.
          seed: If given, each initializer gets a seed derived from it, so the
            initial weights are reproducible in eager and graph mode (as inside a
            TFF computation). None draws fresh weights.
          zero_local: Initialize the user embedding to zeros (where
            reconstruction starts) instead of the normal draw.
          group_size: If given, the model serves a group of this many users:
            the local layers are `[group_size, dim]` tables starting at zeros,
            and the input is `(slots, items)`, `slots` naming each example's
            user row. The global layers are unchanged.
          **kwargs: Passed to `tf.keras.Model`.
        """
        super().__init__(**kwargs)
        self.config = config

        def layer_seed(i):
            return None if seed is None else seed * 1000 + i

        def embedding_init(i):
            return tf.keras.initializers.RandomNormal(
                stddev=EMBEDDING_STDDEV, seed=layer_seed(i)
            )

        self.group_size = group_size

        def user_layer(dim, i, name):
            if group_size is None:
                return UserEmbedding(dim, seed=layer_seed(i), zeros=zero_local, name=name)
            return tf.keras.layers.Embedding(
                group_size, dim, embeddings_initializer='zeros', name=name)

        self.user_gmf = user_layer(config.gmf_dim, 0, 'user_gmf')
        self.item_gmf = tf.keras.layers.Embedding(
            config.num_items,
            config.gmf_dim,
            embeddings_initializer=embedding_init(1),
            name='item_gmf',
        )
        self.user_gmf.build((None,))
        self.item_gmf.build((None,))
        self.tower = []
        if config.use_mlp:
            self.user_mlp = user_layer(config.mlp_dim, 2, 'user_mlp')
            self.item_mlp = tf.keras.layers.Embedding(
                config.num_items,
                config.mlp_dim,
                embeddings_initializer=embedding_init(3),
                name='item_mlp',
            )
            self.user_mlp.build((None,))
            self.item_mlp.build((None,))
            fan_in = 2 * config.mlp_dim
            for i, width in enumerate(config.mlp_layers):
                layer = tf.keras.layers.Dense(
                    width,
                    kernel_initializer=tf.keras.initializers.GlorotUniform(
                        seed=layer_seed(10 + i)
                    ),
                    bias_initializer='zeros',
                    name=f'tower_{i}',
                )
                layer.build((None, fan_in))
                self.tower.append(layer)
                fan_in = width
        # Uniform with limit sqrt(3 / fan_in): He/Kaiming-uniform with a=1.
        self.prediction = tf.keras.layers.Dense(
            1,
            kernel_initializer=tf.keras.initializers.VarianceScaling(
                scale=1.0, mode='fan_in', distribution='uniform', seed=layer_seed(4)
            ),
            bias_initializer='zeros',
            name='prediction',
        )
        self.prediction.build((None, config.prediction_input_dim))
        self.built = True  # Every layer is built above; no input shape needed.

    @property
    def global_layers(self) -> list[tf.keras.layers.Layer]:
        layers = [self.item_gmf]
        if self.config.use_mlp:
            layers.append(self.item_mlp)
            layers.extend(self.tower)
        layers.append(self.prediction)
        return layers

    @property
    def local_layers(self) -> list[tf.keras.layers.Layer]:
        if self.config.use_mlp:
            return [self.user_gmf, self.user_mlp]
        return [self.user_gmf]

    @property
    def global_variables(self) -> list[tf.Variable]:
        return [v for layer in self.global_layers for v in layer.trainable_weights]

    @property
    def local_variables(self) -> list[tf.Variable]:
        return [v for layer in self.local_layers for v in layer.trainable_weights]

    def call(self, inputs, training=False):
        if self.group_size is None:
            items = tf.cast(tf.reshape(inputs, [-1]), tf.int32)
            users = items  # UserEmbedding broadcasts its one row.
        else:
            users, items = (tf.cast(tf.reshape(x, [-1]), tf.int32) for x in inputs)
        use_mlp = self.config.use_mlp
        return neumf_logits(
            self.user_gmf(users),
            self.user_mlp(users) if use_mlp else None,
            self.item_gmf(items),
            self.item_mlp(items) if use_mlp else None,
            [(layer.kernel, layer.bias) for layer in self.tower],
            (self.prediction.kernel, self.prediction.bias),
        )


def build_keras_model(config: ModelConfig, *, seed: int | None = None) -> NeuMF:
    """Builds a NeuMF with freshly initialized weights.

    Args:
      config: The model sizes.
      seed: If given, the initial weights are a function of it.

    Returns:
      A built `NeuMF`.
    """
    return NeuMF(config, seed=seed)


def global_weight_specs(config: ModelConfig) -> list[tf.TensorSpec]:
    """Shapes of the global weights, in `NeuMF.global_variables` order."""
    specs = [tf.TensorSpec([config.num_items, d], tf.float32) for d in config.table_dims]
    if config.use_mlp:
        fan_in = 2 * config.mlp_dim
        for width in config.mlp_layers:
            specs += [tf.TensorSpec([fan_in, width], tf.float32),
                      tf.TensorSpec([width], tf.float32)]
            fan_in = width
    return specs + [tf.TensorSpec([config.prediction_input_dim, 1], tf.float32),
                    tf.TensorSpec([1], tf.float32)]


def global_tensors(config: ModelConfig, global_weights: Sequence) -> list[tf.Tensor]:
    """The global weights as float32 tensors, checked against `config`.

    Raises:
      ValueError: If their number or shapes do not match.
    """
    specs = global_weight_specs(config)
    weights = [tf.convert_to_tensor(w, tf.float32) for w in global_weights]
    if len(weights) != len(specs) or any(
            not w.shape.is_compatible_with(s.shape) for w, s in zip(weights, specs)):
        raise ValueError(
            'global_weights do not match the config: got '
            f'{[tuple(w.shape) for w in weights]}, expected '
            f'{[tuple(s.shape) for s in specs]}')
    return weights


def local_weight_specs(config: ModelConfig, *, num_users: int | None = 1
                       ) -> list[tf.TensorSpec]:
    """Shapes of the user embedding tables (`NeuMF.local_variables` order)."""
    return [tf.TensorSpec([num_users, d], tf.float32) for d in config.local_dims]


def split_tables(config: ModelConfig, global_weights: Sequence[tf.Tensor]):
    """`(item tables, dense weights)`: the embedding tables and the rest."""
    weights = list(global_weights)
    num_tables = len(config.table_dims)
    return weights[:num_tables], weights[num_tables:]


def split_global_weights(config: ModelConfig, global_weights: Sequence[tf.Tensor]):
    """`(item_gmf, item_mlp or None, [(kernel, bias)] tower, (kernel, bias))`."""
    tables, dense = split_tables(config, global_weights)
    tower, prediction = _dense_parts(config, dense)
    return tables[0], (tables[1] if config.use_mlp else None), tower, prediction


def _dense_parts(config: ModelConfig, dense: Sequence[tf.Tensor]):
    """`(tower [(kernel, bias)], prediction (kernel, bias))` of dense weights."""
    layers = len(config.mlp_layers) if config.use_mlp else 0
    tower = [(dense[2 * i], dense[2 * i + 1]) for i in range(layers)]
    return tower, (dense[-2], dense[-1])


def user_item_logits(config: ModelConfig, local: Sequence[tf.Tensor],
                     item_rows: Sequence[tf.Tensor], dense: Sequence[tf.Tensor]
                     ) -> tf.Tensor:
    """NeuMF logits of a group of users, each with its own items.

    concat(u, i) @ K = u @ K_top + i @ K_bottom: the first tower layer is
    computed as a per-user part plus a per-item part, instead of the widest
    layer for every (user, item) pair.

    Args:
      config: The model sizes.
      local: The users' embedding tables, `[G, dim]` each.
      item_rows: Item embedding rows per position, `[G, L, dim]` per table.
      dense: Tower and prediction weights (`split_tables`), shared, or one
        copy per user with a leading `[G]` axis (the client update perturbs
        each user's copy separately).

    Returns:
      `[G, L]` logits.
    """
    tower, prediction = _dense_parts(config, dense)
    first = None
    if config.use_mlp:
        kernel, bias = tower[0]
        top, bottom = kernel[..., :config.mlp_dim, :], kernel[..., config.mlp_dim:, :]
        if len(kernel.shape) == 3:
            user_part = tf.einsum('gi,gio->go', local[1], top)
        else:
            user_part = tf.matmul(local[1], top)
        first = user_part[:, tf.newaxis, :] + _linear(item_rows[1], bottom, bias)
    return neumf_logits(local[0][:, tf.newaxis, :], None, item_rows[0], None,
                        tower, prediction, first_preactivation=first)


def score_items(
    config: ModelConfig,
    global_weights: Sequence[tf.Tensor],
    local_weights: Sequence[tf.Tensor],
    items: tf.Tensor,
) -> tf.Tensor:
    """Scores items for many users at once, with the same math as `NeuMF`.

    Args:
      config: The model sizes.
      global_weights: The global weights in `NeuMF.global_variables` order.
      local_weights: Per-user tables in `NeuMF.local_variables` order, each
        `[num_users, dim]` (row u is user u's embedding).
      items: `[num_users, num_candidates]` item ids.

    Returns:
      `[num_users, num_candidates]` logits.
    """
    tables, dense = split_tables(config, global_weights)
    if config.use_mlp:
        # The item part of the first layer once per item, then gathered.
        kernel, bias = dense[0], dense[1]
        item_part = tf.matmul(tables[1], kernel[config.mlp_dim:])
        user_part = tf.matmul(local_weights[1], kernel[:config.mlp_dim])
        first = user_part[:, tf.newaxis, :] + tf.gather(item_part, items) + bias
        tower, prediction = _dense_parts(config, dense)
        return neumf_logits(local_weights[0][:, tf.newaxis, :], None,
                            tf.gather(tables[0], items), None, tower, prediction,
                            first_preactivation=first)
    return user_item_logits(config, local_weights, [tf.gather(tables[0], items)], dense)


def build_reconstruction_model(
    config: ModelConfig, *, seed: int | None = None, zero_local: bool = False
) -> tff.learning.models.ReconstructionModel:
    """Wraps a fresh `NeuMF` in TFF's reconstruction model API.

    The global layers are aggregated by the server; the local layers (the user
    embedding) are declared local, so TFF's Federated Reconstruction and this
    project's processes agree on what never leaves the client.

    Args:
      config: The model sizes.
      seed: Optional seed of the initial weights.
      zero_local: Start the user embedding at zeros (see `NeuMF`).

    Returns:
      A `tff.learning.models.ReconstructionModel` whose batches are
      `(items [batch] int32, labels [batch] float32)`.
    """
    model = NeuMF(config, seed=seed, zero_local=zero_local)
    input_spec = (
        tf.TensorSpec(shape=[None], dtype=tf.int32),
        tf.TensorSpec(shape=[None], dtype=tf.float32),
    )
    return tff.learning.models.ReconstructionModel.from_keras_model_and_layers(
        model,
        global_layers=model.global_layers,
        local_layers=model.local_layers,
        input_spec=input_spec,
    )

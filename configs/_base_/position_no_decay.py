# The weight-decay exemptions our configs share (optim_wrapper.paramwise_cfg.custom_keys): the parameters of
# every position encoding, under the state-dict root of the attribute the backbone mounts it on (one entry per
# root of cpvt_backbones.layers.position.state_dict_roots(); tests/test_weight_decay.py holds the two equal), and
# the class token. mmengine matches custom_keys as substrings of parameter names: each root keeps its trailing
# '.', so that it matches that encoding's parameters only.
position_no_decay = {key: dict(decay_mult=0.) for key in (
    'pos_block.', 'pos_qk.', 'pos_embed.', 'pos_sincos.', 'rel_pos.', 'rope.', 'cls_token')}

"""cuTile forwards for Granite (architecture of ibm-granite/granite-3.3-2b-instruct).

Granite is the Llama decoder layer with four scales (muP). ``residual_multiplier`` scales each
sub-block's output before its residual add (``residual + out * m``): a field of the description,
folded into the o_proj and down_proj weights of the GEMMs that add the residual (the weights
are copied once, times m, when the patch is applied); with ``linear`` off the add+RMSNorm kernel
has no scale and the multiply stays PyTorch's. ``attention_multiplier`` is the softmax scale in
place of 1/sqrt(head_dim): upstream sets it as the module's ``scaling``, which the attention
kernels take as their scale argument. Not folded, PyTorch's as upstream writes them:
``embedding_multiplier`` (the model forward multiplies the embeddings before the first layer)
and ``logits_scaling`` (the CausalLM forward divides lm_head's output); both are in forwards
the patch does not replace, and folding either into a weight would scale it twice.
"""

from tilegym.transformers.family import Family

FAMILY = Family("transformers.models.granite.modeling_granite", "Granite", residual_multiplier=True)

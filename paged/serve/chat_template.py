"""Chat messages -> one prompt: the checkpoint's template, rendered by ``paged.models.chat_render``.

The renderer lives below the ladder so that the offline ``LLM.chat`` and the
server render a conversation the same way; the server reaches it from here
(``models.ServedModel`` renders on the offload pool, since the tokenizing it
ends with lets go of the GIL).
"""

from paged.models.chat_render import ChatRenderer, TemplateError, compile_template, hermes_calls

__all__ = ["ChatRenderer", "TemplateError", "compile_template", "hermes_calls"]

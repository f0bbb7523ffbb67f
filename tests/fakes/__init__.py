"""Fakes of the services the runner talks to, served on 127.0.0.1 or called in process: the
fault-injecting provider (``fake_provider``, with the batch endpoints of ``fake_batches``), the
language-model server (``fake_llm_server``), the Hugging Face hub (``fake_hub``), the pure
wire-format responders they serve (``wire_formats``, streamed by ``sse_streams``) and extra
responder factories (``responders``). Test files import from here, never from each other."""

"""The committed state blob is pinned: a change to its bytes must be a deliberate schema change."""

from __future__ import annotations

import uuid

import msgspec
import pytest

from keylane.cells import MemoryBlob, MemoryEntry
from keylane.core.pages import PageLayout, decode_page, encode_page
from keylane.core.state import (
    PAUSED_SCHEMA_VERSION,
    STATE_SCHEMA_VERSION,
    UNPAUSED_SCHEMA_VERSION,
    ArmedTimer,
    BufferedEvent,
    CacheEntry,
    Continuation,
    CorruptState,
    EmptiedKeyState,
    KeyState,
    OutboxRecord,
    PagedKeyState,
    Paused,
    PendingIntent,
    StateFromTheFuture,
    decode_state,
    emptied,
    encode_state,
    epoch_of,
    is_settled,
    paged,
    settle,
    unpaged,
)

# The msgpack bytes of reference_state(1), written by schema version 1. Version 2 only added
# fields with defaults (identity streams, settled intents), so a v1 blob still decodes and
# its logical-topic ``applied`` entries are read as they were (see core.outbox.applied_offset).
# Its buffered event still carries the ``payload`` copy that version 3 no longer stores.
GOLDEN_V1_HEX = (
    "8ab473746174655f736368656d615f76657273696f6e01a373657107a66d656d6f727981a7656e747269657382a46e61"
    "6d6583a576616c7565a3616461a472696e67c2ae6c6173745f6163636573735f6d73cd03e8a6726563656e7483a57661"
    "6c75659301a374776fc40103a472696e67c3ae6c6173745f6163636573735f6d73cd07d0ac636f6e74696e756174696f"
    "6e87a373657106aa737465705f696e64657803b270656e64696e675f696e74656e745f69647392a8696e74656e742d61"
    "a8696e74656e742d62a8736e617073686f74c404736e6170af73757370656e6465645f61745f6d73cd0bb8ab64656164"
    "6c696e655f6d73cd0fa0ab657363616c6174696f6e7301a96c6c6d5f63616368659189a963616368655f6b6579a2636b"
    "a8726573706f6e7365c40472657370a6646967657374a26431aa637265617465645f6d73cd1388ab6469676573745f6f"
    "6e6c79c3a86d6f64656c5f6964a666616b652d31ad70726f6d70745f746f6b656e730bb1636f6d706c6574696f6e5f74"
    "6f6b656e730ca473697a657ba770656e64696e6781a8696e74656e742d6184a9696e74656e745f6964a8696e74656e74"
    "2d61a4746f6f6ca6726566756e64a46b696e64a8617070726f76616cad657870697265735f61745f6d73cd1770a76170"
    "706c69656482ac6167656e742e6576656e747329ad6167656e742e726573756c747309a66f7574626f789187a9726563"
    "6f72645f6964a56f75742d31a5746f706963ac6167656e742e6572726f7273a36b6579c4036b2330a576616c7565c402"
    "7b7dac6f726967696e5f746f706963ac6167656e742e6576656e7473ad6f726967696e5f6f666673657429a56c616265"
    "6cb061637469766174696f6e5f6572726f72a862756666657265649186a576616c7565c4197b2276223a312c22706179"
    "6c6f6164223a226c61746572227da77061796c6f6164c4056c61746572ac6f726967696e5f746f706963ac6167656e74"
    "2e6576656e7473b36f726967696e5f62726f6b65725f746f706963b170726f642e6167656e742e6576656e7473b06f72"
    "6967696e5f706172746974696f6e02ad6f726967696e5f6f66667365742aa674696d65727382a46869746c82ab646561"
    "646c696e655f6d73cd2328a5746f6b656eab6869746c3a373a39303030a374746c82ab646561646c696e655f6d73ce00"
    "3711a8a5746f6b656ead74746c3a373a33363039303030"
)


# The msgpack bytes of reference_state(2), written by schema version 2 (its buffered event
# also stores its payload next to the envelope).
GOLDEN_V2_HEX = (
    "8bb473746174655f736368656d615f76657273696f6e02a373657107a66d656d6f727981a7656e747269657382a46e61"
    "6d6583a576616c7565a3616461a472696e67c2ae6c6173745f6163636573735f6d73cd03e8a6726563656e7483a57661"
    "6c75659301a374776fc40103a472696e67c3ae6c6173745f6163636573735f6d73cd07d0ac636f6e74696e756174696f"
    "6e87a373657106aa737465705f696e64657803b270656e64696e675f696e74656e745f69647392a8696e74656e742d61"
    "a8696e74656e742d62a8736e617073686f74c404736e6170af73757370656e6465645f61745f6d73cd0bb8ab64656164"
    "6c696e655f6d73cd0fa0ab657363616c6174696f6e7301a96c6c6d5f63616368659189a963616368655f6b6579a2636b"
    "a8726573706f6e7365c40472657370a6646967657374a26431aa637265617465645f6d73cd1388ab6469676573745f6f"
    "6e6c79c3a86d6f64656c5f6964a666616b652d31ad70726f6d70745f746f6b656e730bb1636f6d706c6574696f6e5f74"
    "6f6b656e730ca473697a657ba770656e64696e6781a8696e74656e742d6184a9696e74656e745f6964a8696e74656e74"
    "2d61a4746f6f6ca6726566756e64a46b696e64a8617070726f76616cad657870697265735f61745f6d73cd1770a76170"
    "706c69656483b370726f642e6167656e742e6576656e74732f3229b470726f642e6167656e742e726573756c74732f32"
    "09b370726f642e6167656e742e6576656e74732f3511a66f7574626f789188a97265636f72645f6964a56f75742d31a5"
    "746f706963ac6167656e742e6572726f7273a36b6579c4036b2330a576616c7565c4027b7dac6f726967696e5f746f70"
    "6963ac6167656e742e6576656e7473ad6f726967696e5f6f666673657429a56c6162656cb061637469766174696f6e5f"
    "6572726f72ad6f726967696e5f73747265616db370726f642e6167656e742e6576656e74732f32a86275666665726564"
    "9187a576616c7565c4197b2276223a312c227061796c6f6164223a226c61746572227da77061796c6f6164c4056c6174"
    "6572ac6f726967696e5f746f706963ac6167656e742e6576656e7473b36f726967696e5f62726f6b65725f746f706963"
    "b170726f642e6167656e742e6576656e7473b06f726967696e5f706172746974696f6e02ad6f726967696e5f6f666673"
    "65742aa7636f70795f6f6693b170726f642e6167656e742e6576656e74730512a674696d65727382a46869746c82ab64"
    "6561646c696e655f6d73cd2328a5746f6b656eab6869746c3a373a39303030a374746c82ab646561646c696e655f6d73"
    "ce003711a8a5746f6b656ead74746c3a373a33363039303030af736574746c65645f696e74656e747391a8696e74656e"
    "742d7a"
)


# The msgpack bytes of reference_state(3), written by schema version 3: each buffered event is
# stored once, as its record value. Version 4 only added ``epoch`` (default 0).
GOLDEN_V3_HEX = (
    "8bb473746174655f736368656d615f76657273696f6e03a373657107a66d656d6f727981a7656e747269657382a46e61"
    "6d6583a576616c7565a3616461a472696e67c2ae6c6173745f6163636573735f6d73cd03e8a6726563656e7483a57661"
    "6c75659301a374776fc40103a472696e67c3ae6c6173745f6163636573735f6d73cd07d0ac636f6e74696e756174696f"
    "6e87a373657106aa737465705f696e64657803b270656e64696e675f696e74656e745f69647392a8696e74656e742d61"
    "a8696e74656e742d62a8736e617073686f74c404736e6170af73757370656e6465645f61745f6d73cd0bb8ab64656164"
    "6c696e655f6d73cd0fa0ab657363616c6174696f6e7301a96c6c6d5f63616368659189a963616368655f6b6579a2636b"
    "a8726573706f6e7365c40472657370a6646967657374a26431aa637265617465645f6d73cd1388ab6469676573745f6f"
    "6e6c79c3a86d6f64656c5f6964a666616b652d31ad70726f6d70745f746f6b656e730bb1636f6d706c6574696f6e5f74"
    "6f6b656e730ca473697a657ba770656e64696e6781a8696e74656e742d6184a9696e74656e745f6964a8696e74656e74"
    "2d61a4746f6f6ca6726566756e64a46b696e64a8617070726f76616cad657870697265735f61745f6d73cd1770a76170"
    "706c69656483b370726f642e6167656e742e6576656e74732f3229b470726f642e6167656e742e726573756c74732f32"
    "09b370726f642e6167656e742e6576656e74732f3511a66f7574626f789188a97265636f72645f6964a56f75742d31a5"
    "746f706963ac6167656e742e6572726f7273a36b6579c4036b2330a576616c7565c4027b7dac6f726967696e5f746f70"
    "6963ac6167656e742e6576656e7473ad6f726967696e5f6f666673657429a56c6162656cb061637469766174696f6e5f"
    "6572726f72ad6f726967696e5f73747265616db370726f642e6167656e742e6576656e74732f32a86275666665726564"
    "9186a576616c7565c4197b2276223a312c227061796c6f6164223a226c61746572227dac6f726967696e5f746f706963"
    "ac6167656e742e6576656e7473b36f726967696e5f62726f6b65725f746f706963b170726f642e6167656e742e657665"
    "6e7473b06f726967696e5f706172746974696f6e02ad6f726967696e5f6f66667365742aa7636f70795f6f6693b17072"
    "6f642e6167656e742e6576656e74730512a674696d65727382a46869746c82ab646561646c696e655f6d73cd2328a574"
    "6f6b656eab6869746c3a373a39303030a374746c82ab646561646c696e655f6d73ce003711a8a5746f6b656ead74746c"
    "3a373a33363039303030af736574746c65645f696e74656e747391a8696e74656e742d7a"
)


# The msgpack bytes of reference_state(4), written by schema version 4. Version 5 only added
# ``paused`` and ``held`` (defaults None and []).
GOLDEN_V4_HEX = (
    "8cb473746174655f736368656d615f76657273696f6e04a373657107a66d656d6f727981a7656e747269657382a46e61"
    "6d6583a576616c7565a3616461a472696e67c2ae6c6173745f6163636573735f6d73cd03e8a6726563656e7483a57661"
    "6c75659301a374776fc40103a472696e67c3ae6c6173745f6163636573735f6d73cd07d0ac636f6e74696e756174696f"
    "6e87a373657106aa737465705f696e64657803b270656e64696e675f696e74656e745f69647392a8696e74656e742d61"
    "a8696e74656e742d62a8736e617073686f74c404736e6170af73757370656e6465645f61745f6d73cd0bb8ab64656164"
    "6c696e655f6d73cd0fa0ab657363616c6174696f6e7301a96c6c6d5f63616368659189a963616368655f6b6579a2636b"
    "a8726573706f6e7365c40472657370a6646967657374a26431aa637265617465645f6d73cd1388ab6469676573745f6f"
    "6e6c79c3a86d6f64656c5f6964a666616b652d31ad70726f6d70745f746f6b656e730bb1636f6d706c6574696f6e5f74"
    "6f6b656e730ca473697a657ba770656e64696e6781a8696e74656e742d6184a9696e74656e745f6964a8696e74656e74"
    "2d61a4746f6f6ca6726566756e64a46b696e64a8617070726f76616cad657870697265735f61745f6d73cd1770a76170"
    "706c69656483b370726f642e6167656e742e6576656e74732f3229b470726f642e6167656e742e726573756c74732f32"
    "09b370726f642e6167656e742e6576656e74732f3511a66f7574626f789188a97265636f72645f6964a56f75742d31a5"
    "746f706963ac6167656e742e6572726f7273a36b6579c4036b2330a576616c7565c4027b7dac6f726967696e5f746f70"
    "6963ac6167656e742e6576656e7473ad6f726967696e5f6f666673657429a56c6162656cb061637469766174696f6e5f"
    "6572726f72ad6f726967696e5f73747265616db370726f642e6167656e742e6576656e74732f32a86275666665726564"
    "9186a576616c7565c4197b2276223a312c227061796c6f6164223a226c61746572227dac6f726967696e5f746f706963"
    "ac6167656e742e6576656e7473b36f726967696e5f62726f6b65725f746f706963b170726f642e6167656e742e657665"
    "6e7473b06f726967696e5f706172746974696f6e02ad6f726967696e5f6f66667365742aa7636f70795f6f6693b17072"
    "6f642e6167656e742e6576656e74730512a674696d65727382a46869746c82ab646561646c696e655f6d73cd2328a574"
    "6f6b656eab6869746c3a373a39303030a374746c82ab646561646c696e655f6d73ce003711a8a5746f6b656ead74746c"
    "3a373a33363039303030af736574746c65645f696e74656e747391a8696e74656e742d7aa565706f63680c"
)


# The msgpack bytes of reference_state(5), written by schema version 5 before ``settled_ids``
# (no version came with it: see the docstring of keylane.core.state).
GOLDEN_V5_HEX = (
    "8eb473746174655f736368656d615f76657273696f6e05a373657107a66d656d6f727981a7656e747269657382a46e61"
    "6d6583a576616c7565a3616461a472696e67c2ae6c6173745f6163636573735f6d73cd03e8a6726563656e7483a57661"
    "6c75659301a374776fc40103a472696e67c3ae6c6173745f6163636573735f6d73cd07d0ac636f6e74696e756174696f"
    "6e87a373657106aa737465705f696e64657803b270656e64696e675f696e74656e745f69647392a8696e74656e742d61"
    "a8696e74656e742d62a8736e617073686f74c404736e6170af73757370656e6465645f61745f6d73cd0bb8ab64656164"
    "6c696e655f6d73cd0fa0ab657363616c6174696f6e7301a96c6c6d5f63616368659189a963616368655f6b6579a2636b"
    "a8726573706f6e7365c40472657370a6646967657374a26431aa637265617465645f6d73cd1388ab6469676573745f6f"
    "6e6c79c3a86d6f64656c5f6964a666616b652d31ad70726f6d70745f746f6b656e730bb1636f6d706c6574696f6e5f74"
    "6f6b656e730ca473697a657ba770656e64696e6781a8696e74656e742d6184a9696e74656e745f6964a8696e74656e74"
    "2d61a4746f6f6ca6726566756e64a46b696e64a8617070726f76616cad657870697265735f61745f6d73cd1770a76170"
    "706c69656483b370726f642e6167656e742e6576656e74732f3229b470726f642e6167656e742e726573756c74732f32"
    "09b370726f642e6167656e742e6576656e74732f3511a66f7574626f789188a97265636f72645f6964a56f75742d31a5"
    "746f706963ac6167656e742e6572726f7273a36b6579c4036b2330a576616c7565c4027b7dac6f726967696e5f746f70"
    "6963ac6167656e742e6576656e7473ad6f726967696e5f6f666673657429a56c6162656cb061637469766174696f6e5f"
    "6572726f72ad6f726967696e5f73747265616db370726f642e6167656e742e6576656e74732f32a86275666665726564"
    "9186a576616c7565c4197b2276223a312c227061796c6f6164223a226c61746572227dac6f726967696e5f746f706963"
    "ac6167656e742e6576656e7473b36f726967696e5f62726f6b65725f746f706963b170726f642e6167656e742e657665"
    "6e7473b06f726967696e5f706172746974696f6e02ad6f726967696e5f6f66667365742aa7636f70795f6f6693b17072"
    "6f642e6167656e742e6576656e74730512a674696d65727382a46869746c82ab646561646c696e655f6d73cd2328a574"
    "6f6b656eab6869746c3a373a39303030a374746c82ab646561646c696e655f6d73ce003711a8a5746f6b656ead74746c"
    "3a373a33363039303030af736574746c65645f696e74656e747391a8696e74656e742d7aa565706f63680ca670617573"
    "656484a86f70657261746f72a3616461a6726561736f6eac726566756e6473206c6f6f70a561745f6d73cd1f40aa636f"
    "6d6d616e645f6964a5636d642d31a468656c649186a576616c7565c4187b22696e74656e745f6964223a22696e74656e"
    "742d61227dac6f726967696e5f746f706963ad6167656e742e726573756c7473b36f726967696e5f62726f6b65725f74"
    "6f706963b270726f642e6167656e742e726573756c7473b06f726967696e5f706172746974696f6e02ad6f726967696e"
    "5f6f66667365740aa7636f70795f6f66c0"
)


# The msgpack bytes of reference_state(settled_ids=True) under STATE_SCHEMA_VERSION 5. Never
# edit by hand to make the test pass: a new encoding needs a new schema version and a
# migration, or a field an older keylane can ignore (and the reason it can, in the docstring
# of keylane.core.state).
GOLDEN_HEX = (
    "8fb473746174655f736368656d615f76657273696f6e05a373657107a66d656d6f727981a7656e747269657382a46e61"
    "6d6583a576616c7565a3616461a472696e67c2ae6c6173745f6163636573735f6d73cd03e8a6726563656e7483a57661"
    "6c75659301a374776fc40103a472696e67c3ae6c6173745f6163636573735f6d73cd07d0ac636f6e74696e756174696f"
    "6e87a373657106aa737465705f696e64657803b270656e64696e675f696e74656e745f69647392a8696e74656e742d61"
    "a8696e74656e742d62a8736e617073686f74c404736e6170af73757370656e6465645f61745f6d73cd0bb8ab64656164"
    "6c696e655f6d73cd0fa0ab657363616c6174696f6e7301a96c6c6d5f63616368659189a963616368655f6b6579a2636b"
    "a8726573706f6e7365c40472657370a6646967657374a26431aa637265617465645f6d73cd1388ab6469676573745f6f"
    "6e6c79c3a86d6f64656c5f6964a666616b652d31ad70726f6d70745f746f6b656e730bb1636f6d706c6574696f6e5f74"
    "6f6b656e730ca473697a657ba770656e64696e6781a8696e74656e742d6184a9696e74656e745f6964a8696e74656e74"
    "2d61a4746f6f6ca6726566756e64a46b696e64a8617070726f76616cad657870697265735f61745f6d73cd1770a76170"
    "706c69656483b370726f642e6167656e742e6576656e74732f3229b470726f642e6167656e742e726573756c74732f32"
    "09b370726f642e6167656e742e6576656e74732f3511a66f7574626f789188a97265636f72645f6964a56f75742d31a5"
    "746f706963ac6167656e742e6572726f7273a36b6579c4036b2330a576616c7565c4027b7dac6f726967696e5f746f70"
    "6963ac6167656e742e6576656e7473ad6f726967696e5f6f666673657429a56c6162656cb061637469766174696f6e5f"
    "6572726f72ad6f726967696e5f73747265616db370726f642e6167656e742e6576656e74732f32a86275666665726564"
    "9186a576616c7565c4197b2276223a312c227061796c6f6164223a226c61746572227dac6f726967696e5f746f706963"
    "ac6167656e742e6576656e7473b36f726967696e5f62726f6b65725f746f706963b170726f642e6167656e742e657665"
    "6e7473b06f726967696e5f706172746974696f6e02ad6f726967696e5f6f66667365742aa7636f70795f6f6693b17072"
    "6f642e6167656e742e6576656e74730512a674696d65727382a46869746c82ab646561646c696e655f6d73cd2328a574"
    "6f6b656eab6869746c3a373a39303030a374746c82ab646561646c696e655f6d73ce003711a8a5746f6b656ead74746c"
    "3a373a33363039303030af736574746c65645f696e74656e747391a8696e74656e742d7aa565706f63680ca670617573"
    "656484a86f70657261746f72a3616461a6726561736f6eac726566756e6473206c6f6f70a561745f6d73cd1f40aa636f"
    "6d6d616e645f6964a5636d642d31a468656c649186a576616c7565c4187b22696e74656e745f6964223a22696e74656e"
    "742d61227dac6f726967696e5f746f706963ad6167656e742e726573756c7473b36f726967696e5f62726f6b65725f74"
    "6f706963b270726f642e6167656e742e726573756c7473b06f726967696e5f706172746974696f6e02ad6f726967696e"
    "5f6f66667365740aa7636f70795f6f66c0ab736574746c65645f696473c4103f1c9e2a7b4d5e8fa1b2c3d4e5f60718"
)

SETTLED_UUID = "3f1c9e2a-7b4d-5e8f-a1b2-c3d4e5f60718"


def reference_state(version: int = PAUSED_SCHEMA_VERSION, *, settled_ids: bool = False) -> KeyState:
    """A KeyState with every field (nested ones included) set away from its default; as
    schema ``version`` 1 wrote it, the fields version 2 added are left at their defaults.
    Version 3 added nothing, so reference_state(2) and reference_state(3) differ only in
    their version (what a v2 blob stored twice, decoding drops); version 4 added ``epoch``,
    version 5 ``paused`` and ``held``. ``settled_ids`` came without a version: only a state
    written since has them."""
    state = KeyState(
        state_schema_version=version,
        seq=7,
        memory=MemoryBlob(
            entries={
                "name": MemoryEntry(value="ada", ring=False, last_access_ms=1_000),
                "recent": MemoryEntry(value=[1, "two", b"\x03"], ring=True, last_access_ms=2_000),
            }
        ),
        continuation=Continuation(
            seq=6,
            step_index=3,
            pending_intent_ids=["intent-a", "intent-b"],
            snapshot=b"snap",
            suspended_at_ms=3_000,
            deadline_ms=4_000,
            escalations=1,
        ),
        llm_cache=[
            CacheEntry(
                cache_key="ck",
                response=b"resp",
                digest="d1",
                created_ms=5_000,
                digest_only=True,
                model_id="fake-1",
                prompt_tokens=11,
                completion_tokens=12,
                size=123,
            )
        ],
        pending={
            "intent-a": PendingIntent(
                intent_id="intent-a", tool="refund", kind="approval", expires_at_ms=6_000
            )
        },
        applied={"agent.events": 41, "agent.results": 9},
        outbox=[
            OutboxRecord(
                record_id="out-1",
                topic="agent.errors",
                key=b"k#0",
                value=b"{}",
                origin_topic="agent.events",
                origin_offset=41,
                label="activation_error",
            )
        ],
        buffered=[
            BufferedEvent(
                value=b'{"v":1,"payload":"later"}',
                origin_topic="agent.events",
                origin_broker_topic="prod.agent.events",
                origin_partition=2,
                origin_offset=42,
            )
        ],
        timers={
            "hitl": ArmedTimer(deadline_ms=9_000, token="hitl:7:9000"),
            "ttl": ArmedTimer(deadline_ms=3_609_000, token="ttl:7:3609000"),
        },
    )
    if version == 1:
        return state
    state.applied = {"prod.agent.events/2": 41, "prod.agent.results/2": 9, "prod.agent.events/5": 17}
    state.outbox[0].origin_stream = "prod.agent.events/2"
    state.buffered[0].copy_of = ("prod.agent.events", 5, 18)
    state.settled_intents = ["intent-z"]
    if version >= 4:
        state.epoch = 12
    if version >= 5:
        state.paused = Paused(operator="ada", reason="refunds loop", at_ms=8_000, command_id="cmd-1")
        state.held = [
            BufferedEvent(
                value=b'{"intent_id":"intent-a"}',
                origin_topic="agent.results",
                origin_broker_topic="prod.agent.results",
                origin_partition=2,
                origin_offset=10,
            )
        ]
    if settled_ids:
        state.settled_ids = uuid.UUID(SETTLED_UUID).bytes
    return state


# The msgpack bytes of the reference state with its memory paged, written by schema version 6
# before ``settled_ids``: a PagedKeyState whose record leaves memory to its pages.
GOLDEN_V6_HEX = (
    "8fb473746174655f736368656d615f76657273696f6e06a373657107a66d656d6f727981a7656e747269657380ac636f"
    "6e74696e756174696f6e87a373657106aa737465705f696e64657803b270656e64696e675f696e74656e745f69647392"
    "a8696e74656e742d61a8696e74656e742d62a8736e617073686f74c404736e6170af73757370656e6465645f61745f6d"
    "73cd0bb8ab646561646c696e655f6d73cd0fa0ab657363616c6174696f6e7301a96c6c6d5f63616368659189a9636163"
    "68655f6b6579a2636ba8726573706f6e7365c40472657370a6646967657374a26431aa637265617465645f6d73cd1388"
    "ab6469676573745f6f6e6c79c3a86d6f64656c5f6964a666616b652d31ad70726f6d70745f746f6b656e730bb1636f6d"
    "706c6574696f6e5f746f6b656e730ca473697a657ba770656e64696e6781a8696e74656e742d6184a9696e74656e745f"
    "6964a8696e74656e742d61a4746f6f6ca6726566756e64a46b696e64a8617070726f76616cad657870697265735f6174"
    "5f6d73cd1770a76170706c69656483b370726f642e6167656e742e6576656e74732f3229b470726f642e6167656e742e"
    "726573756c74732f3209b370726f642e6167656e742e6576656e74732f3511a66f7574626f789188a97265636f72645f"
    "6964a56f75742d31a5746f706963ac6167656e742e6572726f7273a36b6579c4036b2330a576616c7565c4027b7dac6f"
    "726967696e5f746f706963ac6167656e742e6576656e7473ad6f726967696e5f6f666673657429a56c6162656cb06163"
    "7469766174696f6e5f6572726f72ad6f726967696e5f73747265616db370726f642e6167656e742e6576656e74732f32"
    "a862756666657265649186a576616c7565c4197b2276223a312c227061796c6f6164223a226c61746572227dac6f7269"
    "67696e5f746f706963ac6167656e742e6576656e7473b36f726967696e5f62726f6b65725f746f706963b170726f642e"
    "6167656e742e6576656e7473b06f726967696e5f706172746974696f6e02ad6f726967696e5f6f66667365742aa7636f"
    "70795f6f6693b170726f642e6167656e742e6576656e74730512a674696d65727382a46869746c82ab646561646c696e"
    "655f6d73cd2328a5746f6b656eab6869746c3a373a39303030a374746c82ab646561646c696e655f6d73ce003711a8a5"
    "746f6b656ead74746c3a373a33363039303030af736574746c65645f696e74656e747391a8696e74656e742d7aa56570"
    "6f63680ca670617573656484a86f70657261746f72a3616461a6726561736f6eac726566756e6473206c6f6f70a56174"
    "5f6d73cd1f40aa636f6d6d616e645f6964a5636d642d31a468656c649186a576616c7565c4187b22696e74656e745f69"
    "64223a22696e74656e742d61227dac6f726967696e5f746f706963ad6167656e742e726573756c7473b36f726967696e"
    "5f62726f6b65725f746f706963b270726f642e6167656e742e726573756c7473b06f726967696e5f706172746974696f"
    "6e02ad6f726967696e5f6f66667365740aa7636f70795f6f66c0a5706167657383a76275636b65747310a5736c6f7473"
    "c4020580ac6d656d6f72795f627974657328"
)
# The same under STATE_SCHEMA_VERSION 6 now (paged_reference_state()), and one of its pages.
GOLDEN_PAGED_HEX = (
    "de0010b473746174655f736368656d615f76657273696f6e06a373657107a66d656d6f727981a7656e747269657380ac"
    "636f6e74696e756174696f6e87a373657106aa737465705f696e64657803b270656e64696e675f696e74656e745f6964"
    "7392a8696e74656e742d61a8696e74656e742d62a8736e617073686f74c404736e6170af73757370656e6465645f6174"
    "5f6d73cd0bb8ab646561646c696e655f6d73cd0fa0ab657363616c6174696f6e7301a96c6c6d5f63616368659189a963"
    "616368655f6b6579a2636ba8726573706f6e7365c40472657370a6646967657374a26431aa637265617465645f6d73cd"
    "1388ab6469676573745f6f6e6c79c3a86d6f64656c5f6964a666616b652d31ad70726f6d70745f746f6b656e730bb163"
    "6f6d706c6574696f6e5f746f6b656e730ca473697a657ba770656e64696e6781a8696e74656e742d6184a9696e74656e"
    "745f6964a8696e74656e742d61a4746f6f6ca6726566756e64a46b696e64a8617070726f76616cad657870697265735f"
    "61745f6d73cd1770a76170706c69656483b370726f642e6167656e742e6576656e74732f3229b470726f642e6167656e"
    "742e726573756c74732f3209b370726f642e6167656e742e6576656e74732f3511a66f7574626f789188a97265636f72"
    "645f6964a56f75742d31a5746f706963ac6167656e742e6572726f7273a36b6579c4036b2330a576616c7565c4027b7d"
    "ac6f726967696e5f746f706963ac6167656e742e6576656e7473ad6f726967696e5f6f666673657429a56c6162656cb0"
    "61637469766174696f6e5f6572726f72ad6f726967696e5f73747265616db370726f642e6167656e742e6576656e7473"
    "2f32a862756666657265649186a576616c7565c4197b2276223a312c227061796c6f6164223a226c61746572227dac6f"
    "726967696e5f746f706963ac6167656e742e6576656e7473b36f726967696e5f62726f6b65725f746f706963b170726f"
    "642e6167656e742e6576656e7473b06f726967696e5f706172746974696f6e02ad6f726967696e5f6f66667365742aa7"
    "636f70795f6f6693b170726f642e6167656e742e6576656e74730512a674696d65727382a46869746c82ab646561646c"
    "696e655f6d73cd2328a5746f6b656eab6869746c3a373a39303030a374746c82ab646561646c696e655f6d73ce003711"
    "a8a5746f6b656ead74746c3a373a33363039303030af736574746c65645f696e74656e747391a8696e74656e742d7aa5"
    "65706f63680ca670617573656484a86f70657261746f72a3616461a6726561736f6eac726566756e6473206c6f6f70a5"
    "61745f6d73cd1f40aa636f6d6d616e645f6964a5636d642d31a468656c649186a576616c7565c4187b22696e74656e74"
    "5f6964223a22696e74656e742d61227dac6f726967696e5f746f706963ad6167656e742e726573756c7473b36f726967"
    "696e5f62726f6b65725f746f706963b270726f642e6167656e742e726573756c7473b06f726967696e5f706172746974"
    "696f6e02ad6f726967696e5f6f66667365740aa7636f70795f6f66c0ab736574746c65645f696473c4103f1c9e2a7b4d"
    "5e8fa1b2c3d4e5f60718a5706167657383a76275636b65747310a5736c6f7473c4020580ac6d656d6f72795f62797465"
    "7328"
)
GOLDEN_PAGE_HEX = (
    "82a565706f63680ca7656e747269657382a46e616d6583a576616c7565a3616461a472696e67c2ae6c6173745f616363"
    "6573735f6d73cd03e8a6726563656e7483a576616c75659301a374776fc40103a472696e67c3ae6c6173745f61636365"
    "73735f6d73cd07d0"
)


def paged_reference_state(*, settled_ids: bool = True) -> PagedKeyState:
    layout = PageLayout(buckets=16, slots=b"\x05\x80", memory_bytes=40)
    return paged(reference_state(STATE_SCHEMA_VERSION, settled_ids=settled_ids), layout)


def test_the_reference_state_encodes_to_the_golden_bytes() -> None:
    assert STATE_SCHEMA_VERSION == 6
    assert encode_state(reference_state(settled_ids=True)).hex() == GOLDEN_HEX, (
        "the state encoding changed: bump STATE_SCHEMA_VERSION and add a migration"
    )


def test_a_paged_state_encodes_to_the_golden_bytes_without_its_memory() -> None:
    blob = encode_state(paged_reference_state())

    assert blob.hex() == GOLDEN_PAGED_HEX, "the paged state encoding changed: bump STATE_SCHEMA_VERSION"
    decoded = decode_state(blob)
    assert isinstance(decoded, PagedKeyState)
    assert decoded.state_schema_version == 6
    assert decoded.memory.entries == {}  # read from the pages (keylane.core.key_states)
    assert msgspec.structs.replace(decoded, memory=reference_state().memory) == paged_reference_state()
    before = decode_state(bytes.fromhex(GOLDEN_V6_HEX))  # written before settled_ids
    assert isinstance(before, PagedKeyState)
    assert msgspec.structs.replace(before, memory=reference_state().memory) == paged_reference_state(
        settled_ids=False
    )
    assert [decoded.pages.slot(b) for b in range(16)] == [1, 0, 1] + [0] * 12 + [1]
    assert epoch_of(blob) == 12


def test_a_memory_page_encodes_to_the_golden_bytes() -> None:
    entries = reference_state().memory.entries
    assert encode_page(entries, 12).hex() == GOLDEN_PAGE_HEX
    assert decode_page(bytes.fromhex(GOLDEN_PAGE_HEX), "0/0") == entries
    assert epoch_of(bytes.fromhex(GOLDEN_PAGE_HEX)) == 12  # the fence reads a page's epoch too


def test_a_version_5_keylane_refuses_a_paged_blob() -> None:
    """A keylane that does not know pages must not read a paged key as one without memory."""
    version = msgspec.msgpack.decode(
        bytes.fromhex(GOLDEN_PAGED_HEX), type=_Version4Reader
    ).state_schema_version
    assert version > 5


def test_the_golden_bytes_decode_to_the_reference_state() -> None:
    assert decode_state(bytes.fromhex(GOLDEN_HEX)) == reference_state(settled_ids=True)


def test_a_blob_from_before_settled_ids_decodes_and_its_next_commit_makes_its_uuids_compact() -> None:
    state = decode_state(bytes.fromhex(GOLDEN_V5_HEX))
    assert state == reference_state(5)
    state.settled_intents = ["intent-z", SETTLED_UUID]  # as a writer before settled_ids kept them

    settled_ids, settled_intents = settle(state, [])

    assert (settled_ids, settled_intents) == (uuid.UUID(SETTLED_UUID).bytes, ["intent-z"])
    assert is_settled(state, SETTLED_UUID) and is_settled(state, "intent-z")  # before the commit too


def test_settled_ids_say_no_new_version_and_an_older_keylane_reads_past_them() -> None:
    """An older keylane ignores the field (see keylane.core.state): it reads the rest."""
    blob = encode_state(reference_state(4, settled_ids=True))

    old = msgspec.msgpack.decode(blob, type=_Version4Reader)
    assert (old.state_schema_version, old.seq, old.epoch) == (4, 7, 12)
    assert decode_state(blob).settled_ids == uuid.UUID(SETTLED_UUID).bytes


def test_a_version_1_blob_still_decodes() -> None:
    assert decode_state(bytes.fromhex(GOLDEN_V1_HEX)) == reference_state(1)


def test_a_version_2_blob_still_decodes() -> None:
    assert decode_state(bytes.fromhex(GOLDEN_V2_HEX)) == reference_state(2)


def test_a_version_4_blob_still_decodes_unpaused() -> None:
    state = decode_state(bytes.fromhex(GOLDEN_V4_HEX))
    assert state == reference_state(4)
    assert (state.paused, state.held) == (None, [])


class _Version4Reader(msgspec.Struct):
    """What a version 4 keylane decodes a blob into: KeyState without ``paused`` and ``held``."""

    state_schema_version: int
    seq: int
    epoch: int
    buffered: list[BufferedEvent]


def test_only_a_paused_blob_says_version_5_and_a_version_4_keylane_reads_the_others() -> None:
    unpaused = reference_state(4)
    blob = encode_state(unpaused)
    old = msgspec.msgpack.decode(blob, type=_Version4Reader)  # unknown fields at their defaults
    assert (old.state_schema_version, old.seq, old.epoch) == (4, 7, 12)
    assert decode_state(blob) == unpaused

    assert decode_state(bytes.fromhex(GOLDEN_HEX)).state_schema_version == PAUSED_SCHEMA_VERSION
    held_only = msgspec.structs.replace(unpaused, held=reference_state(5).held)
    assert decode_state(encode_state(held_only)).state_schema_version == 5


def test_an_emptied_record_says_the_version_its_cells_need_and_an_older_keylane_reads_it() -> None:
    """The record a paged memory empties into carries the buckets to empty; a keylane that
    predates the field reads the rest (and leaves the pages: only bytes)."""
    blob = encode_state(emptied(reference_state(4), 64))

    decoded = decode_state(blob)
    assert isinstance(decoded, EmptiedKeyState) and decoded.emptied_buckets == 64
    assert unpaged(decoded) == reference_state(4)
    old = msgspec.msgpack.decode(blob, type=_Version4Reader)
    assert (old.state_schema_version, old.seq, old.epoch) == (4, 7, 12)
    assert type(decode_state(encode_state(reference_state(4)))) is KeyState


def test_a_version_3_blob_still_decodes_with_epoch_0() -> None:
    state = decode_state(bytes.fromhex(GOLDEN_V3_HEX))
    assert state == reference_state(3)
    assert state.epoch == 0


def test_the_epoch_is_read_without_decoding_the_rest() -> None:
    assert epoch_of(bytes.fromhex(GOLDEN_HEX)) == 12
    assert epoch_of(bytes.fromhex(GOLDEN_V4_HEX)) == 12
    assert epoch_of(bytes.fromhex(GOLDEN_V3_HEX)) == 0
    assert epoch_of(b"\xc1 not msgpack") is None


@pytest.mark.parametrize("golden", [GOLDEN_V1_HEX, GOLDEN_V2_HEX, GOLDEN_V3_HEX], ids=["v1", "v2", "v3"])
def test_an_old_blob_keeps_its_queued_payload_and_is_written_back_in_the_current_version(golden: str) -> None:
    state = decode_state(bytes.fromhex(golden))

    assert [b.payload for b in state.buffered] == [b"later"]  # decoded from the stored envelope
    rewritten = decode_state(encode_state(state))
    assert rewritten.state_schema_version == UNPAUSED_SCHEMA_VERSION  # not paused
    assert [b.payload for b in rewritten.buffered] == [b"later"]


def test_a_buffered_event_is_stored_once() -> None:
    """Version 2 kept each queued event twice (the envelope and its payload); version 3 keeps
    the envelope only, so a key's queue costs what its records cost."""
    assert bytes.fromhex(GOLDEN_V2_HEX).count(b"later") == 2
    assert bytes.fromhex(GOLDEN_HEX).count(b"later") == 1
    from_v2 = decode_state(bytes.fromhex(GOLDEN_V2_HEX))
    from_v2.epoch = 12  # the one field version 4 added
    assert decode_state(encode_state(from_v2)) == reference_state(4)
    assert encode_state(from_v2).count(b"later") == 1


def test_every_field_of_the_reference_state_is_set_away_from_its_default() -> None:
    """Keeps the golden blob meaningful: a field left at its default would not be pinned."""
    state, fresh = reference_state(settled_ids=True), KeyState()
    for name in KeyState.__struct_fields__:
        if name != "state_schema_version":
            assert getattr(state, name) != getattr(fresh, name), name
    assert state.continuation is not None and state.paused is not None
    by_type: dict[type[msgspec.Struct], list[msgspec.Struct]] = {}
    for struct in [
        *state.memory.entries.values(),
        state.continuation,
        *state.llm_cache,
        *state.pending.values(),
        *state.outbox,
        *state.buffered,
        state.paused,
        *state.held,
    ]:
        by_type.setdefault(type(struct), []).append(struct)
    for struct_type, instances in by_type.items():
        for field in msgspec.structs.fields(struct_type):
            if field.default is not msgspec.NODEFAULT:
                values = [getattr(s, field.name) for s in instances]
                assert any(v != field.default for v in values), f"{struct_type.__name__}.{field.name}"


def test_a_blob_from_a_newer_schema_version_is_refused() -> None:
    future = STATE_SCHEMA_VERSION + 1
    newer = msgspec.msgpack.encode({"state_schema_version": future, "seq": 1})
    newer_with_new_shape = msgspec.msgpack.encode({"state_schema_version": future, "seq": "now a string"})
    newer_struct = msgspec.msgpack.encode(KeyState(state_schema_version=future))

    with pytest.raises(StateFromTheFuture, match=f"schema version {future}"):
        decode_state(newer)
    with pytest.raises(StateFromTheFuture, match="deploy the newer keylane"):
        decode_state(newer_with_new_shape)
    with pytest.raises(StateFromTheFuture):
        decode_state(newer_struct)


@pytest.mark.parametrize(
    "blob",
    [
        b"\xc1 garbage",
        b"not msgpack at all",
        msgspec.msgpack.encode([1, 2, 3]),
        msgspec.msgpack.encode({"state_schema_version": "one"}),
        msgspec.msgpack.encode({"state_schema_version": 1, "seq": "seven"}),
        bytes.fromhex(GOLDEN_V1_HEX)[:-5],
    ],
    ids=["invalid-byte", "text", "array", "version-not-int", "wrong-field-type", "truncated"],
)
def test_a_blob_that_does_not_decode_is_corrupt_state(blob: bytes) -> None:
    with pytest.raises(CorruptState, match="state blob does not decode"):
        decode_state(blob)


@pytest.mark.parametrize("blob", [None, b""])
def test_no_blob_is_a_fresh_key_state(blob: bytes | None) -> None:
    fresh = decode_state(blob)

    assert fresh == KeyState()
    assert (fresh.seq, fresh.continuation, fresh.memory.entries) == (0, None, {})
    assert fresh.state_schema_version == STATE_SCHEMA_VERSION

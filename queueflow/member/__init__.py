"""The member side of share groups: membership, the ShareFetch session, acknowledgements, flow
control, record reading, and the two member APIs built on them, :class:`ShareConsumer` and
``@share_agent`` (:class:`ShareAgent`)."""

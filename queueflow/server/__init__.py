"""The server side of share groups: the share-group coordinator and the share-partition leaders,
their durable state and their timers. Built against a server context,
never against Faust directly (:mod:`queueflow.faust_app` provides the Faust one)."""

"""Python ops: metadata (work schedule), decode, reduce."""

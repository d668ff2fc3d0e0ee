from enum import StrEnum

class JobStatus(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    FAILED = "failed"
    PENDING = "pending"

    def __str__(self) -> str:
        return str(self.value)
